"""Pipeline stages sharing a core (model revision 12): where pinned ranks put several stages on one
core (`costs.stages_per_core`: PP4 on the 2-core machine, stages 0 and 1 on one core, 2 and 3 on
the other), a stage's passes run at a share of the core only while another stage of its block
runs, at full speed while it waits for its input (simulate.py `_ranks`: processor sharing, a
fixed point of each pass's stretch), where every pass had been stretched by the ranks per core.
The simulated step lies between the unshared pipeline's and the stretched one's and never beats
the cores' capacity; the components still add up to the step."""
from __future__ import annotations

from dataclasses import replace

import pytest

from llama31_405b.config.load import load_config
from llama31_405b.planner import fitted
from llama31_405b.planner.context import Context
from llama31_405b.planner.costs import plan, stages_per_core
from llama31_405b.planner import simulate
from llama31_405b.planner.simulate import _run, _turn_factors, run
from llama31_405b.planner.step import breakdown
from test_planner_core_share import config


@pytest.fixture(scope="module")
def cfgs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("turns")
    shapes = {"pp4": (4, 1, 4, 4), "pp2dp2": (4, 1, 2, 4), "dp4": (4, 1, 1, 2),
              "tp2pp2": (4, 2, 2, 4), "pp2": (2, 1, 2, 4)}
    return {k: load_config(config(tmp, k, *v)) for k, v in shapes.items()}


def test_stages_share_a_core_only_where_a_core_holds_several_whole_stages(cfgs):
    ctxs = {k: Context.of(c) for k, c in cfgs.items()}
    got = {k: stages_per_core(ctx, breakdown(ctx, fitted()).core_share) for k, ctx in ctxs.items()}
    assert got == {"pp4": 2, "pp2dp2": 1, "dp4": 1, "tp2pp2": 1, "pp2": 1}
    pp4 = ctxs["pp4"]
    assert stages_per_core(pp4, 4.0) == 4            # 8 stages' worth of ranks per core: 4 each
    assert stages_per_core(replace(pp4, system=replace(pp4.system, pin_ranks=False)), 2.0) == 1
    assert plan(pp4, replace(fitted(), core_share=2.0)).stages_per_core == 2


def test_the_stretch_is_the_pass_s_length_over_what_the_core_gave_it():
    # rank 0 busy 0-2, rank 1 (its core-mate) 1-3: each shares the core for 1 of its 2 s
    f = _turn_factors([[(0.0, 2.0), None], [(1.0, 3.0)]], 2)
    assert f == [[pytest.approx(2 / 1.5), 1.0], [pytest.approx(2 / 1.5)]]
    # ranks of different blocks do not slow each other
    assert _turn_factors([[(0.0, 2.0)], [(5.0, 6.0)], [(0.0, 2.0)]], 2) == [[1.0], [1.0], [1.0]]
    # three stages on one core, all running: a third each
    assert _turn_factors([[(0.0, 3.0)]] * 3, 3) == [[pytest.approx(3.0)]] * 3


def test_stages_taking_turns_run_between_a_core_each_and_every_pass_stretched(cfgs):
    ctx, fit = Context.of(cfgs["pp4"]), fitted()
    b = breakdown(ctx, fit)
    assert b.core_share == 2.0
    alone = breakdown(ctx, replace(fit, core_share=1.0 + 1e-12))      # a core per stage
    p = plan(ctx, replace(fit, core_share=2.0))
    stretched = plan(ctx, replace(fit, core_share=2.0 + 1e-9))   # revision 11: every pass x 2
    assert stretched.stages_per_core == 1
    assert p.chunks[0][0].work_fwd == pytest.approx(alone_plan_work(ctx, fit), rel=1e-6)
    assert alone.step_s < b.step_s < run(stretched, ctx.microbatches).step_s
    # a core does at most one second of work per second: its two stages' work fits in the step
    for block in ((0, 1), (2, 3)):
        work = sum(ctx.microbatches * sum(c.work_fwd + c.work_bwd for c in p.chunks[r])
                   for r in block)
        assert b.step_s >= work
    # the turns show in the compute, as the profile measures it
    assert alone.compute_total_s < b.compute_total_s < 2 * alone.compute_total_s
    assert b.core_turns_s > 0
    assert b.as_dict()["core_turns_s"] == b.core_turns_s


def alone_plan_work(ctx, fit):
    return plan(ctx, replace(fit, core_share=1.0 + 1e-12)).chunks[0][0].work_fwd


def test_the_components_still_add_up_to_the_step(cfgs):
    ctx, fit = Context.of(cfgs["pp4"]), fitted()
    b = breakdown(ctx, fit)
    for rank in range(4):
        r = breakdown(ctx, fit, rank)
        assert r.step_s == pytest.approx(b.step_s, rel=1e-9)
        sim = run(plan(ctx, replace(fit, core_share=2.0)), ctx.microbatches, {}, rank=rank)
        assert r.step_s == pytest.approx(sim.step_s, rel=1e-9)


def test_layouts_without_stages_sharing_a_core_are_simulated_as_before(cfgs):
    """Every other layout keeps a stage's stretch by its ranks per core and no turns."""
    fit = fitted()
    for name in ("pp2dp2", "dp4", "tp2pp2", "pp2"):
        b = breakdown(Context.of(cfgs[name]), fit)
        assert b.core_turns_s == 0.0, name


def test_long_steps_with_turns_are_extrapolated_as_run(cfgs):
    ctx = Context.of(cfgs["pp4"])
    p = plan(ctx, replace(fitted(), core_share=2.0))
    full, fast = _run(p, 24), run(p, 24)
    assert fast.step_s == pytest.approx(full.step_s, rel=1e-3)
    assert fast.turns_s == pytest.approx(full.turns_s, rel=1e-2)
    # the closed forms (the sweep's estimate, the evaluation) keep the bound: every pass x 2
    alone = plan(ctx, replace(fitted(), core_share=1.0 + 1e-12))
    assert p.busy_mb_s == pytest.approx(2 * alone.busy_mb_s, rel=1e-6)


def test_turns_that_do_not_settle_are_an_error(cfgs, monkeypatch):
    monkeypatch.setattr(simulate, "TURN_ROUNDS", 1)
    p = plan(Context.of(cfgs["pp4"]), replace(fitted(), core_share=2.0))
    with pytest.raises(RuntimeError, match="did not settle in 1 rounds"):
        simulate._ranks(p, 4)
