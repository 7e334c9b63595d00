"""Model revision 22: each model chunk's pass has host time of its own beyond its layer slots'
(the pipeline schedule's Python: systems and `Fitted.host_s_per_chunk_pass`), fitted by a joint
fit from a pipeline layout whose ranks each have a core, given the host time per layer pass from
the layouts without a pipeline. Round trips on synthetic profiles the planner writes of its own
prediction with known constants."""
from __future__ import annotations

from dataclasses import replace

import pytest

from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, costs
from llama31_405b.planner.calibrate.joint import _pipelines
from llama31_405b.planner.calibrate.synthetic import synthetic_profile
from llama31_405b.planner.context import Context
from llama31_405b.planner.step import breakdown
from llama31_405b.systems import load_system, system_ids
from test_planner_core_share import config
from test_planner_peer_wait import KNOWN, joint_fit

# (ranks, tp, pp, minibs, vp)
SHAPES = {"tp2": (2, 2, 1, 4, 1), "dp2": (2, 1, 1, 2, 1), "tp2dp2": (4, 2, 1, 4, 1),
          "pp2vp2": (2, 1, 2, 4, 2), "pp2": (2, 1, 2, 4, 1), "pp2dp2vp2": (4, 1, 2, 4, 2)}


@pytest.fixture(scope="module")
def cfgs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chunk_host")
    out = {}
    for name, (ranks, tp, pp, minibs, vp) in SHAPES.items():
        path = config(tmp, name, ranks, tp, pp, minibs)
        path.write_text(path.read_text().replace("vp = 1", f"vp = {vp}"))
        out[name] = load_config(path)
    assert [(c.parallel.pp, c.parallel.vp) for c in out.values()] == [
        (1, 1), (1, 1), (1, 1), (2, 2), (2, 1), (2, 2)]
    return tmp, out


def _fit(chunk: float | None):
    return replace(calibrate.fitted(), **KNOWN, host_s_per_chunk_pass=chunk)


def test_only_the_cpu_prices_a_chunk_pass_by_default():
    """GPUs replay the schedule in CUDA graphs: no prior there, so no published prediction moves."""
    priors = {n: load_system(n).host_s_per_chunk_pass for n in system_ids()}
    assert {n: v for n, v in priors.items() if v} == {"cpu": pytest.approx(5e-4)}
    assert len(priors) > 1


def test_each_chunk_pass_adds_its_host_time_each_way(cfgs):
    _, c = cfgs
    for name in ("pp2vp2", "pp2", "dp2"):
        ctx = Context.of(c[name])
        at = [breakdown(ctx, _fit(x)).host_s for x in (0.0, 1e-3)]
        m = c[name].derived.num_microbatches
        # every pass of every chunk of the critical rank, forward and backward, at a core each
        assert at[1] - at[0] == pytest.approx(1e-3 * m * ctx.vp * 2, rel=1e-6), name
    # None takes the system's prior
    ctx = Context.of(c["pp2vp2"])
    assert costs.chunk_host_s(ctx, _fit(None)) == ctx.system.host_s_per_chunk_pass
    assert costs.chunk_host_s(ctx, _fit(2e-4)) == 2e-4


@pytest.mark.parametrize("chunk", [7e-4, 0.0])
def test_a_joint_fit_gives_the_host_time_per_chunk_pass_back(cfgs, chunk):
    tmp, c = cfgs
    fit = _fit(chunk)
    got = joint_fit(tmp, c, ("tp2", "dp2", "tp2dp2", "pp2vp2"), fit, f"chunk_{chunk}")
    assert got.host_s_per_chunk_pass == pytest.approx(chunk, abs=1e-7)
    assert got.host_s_per_layer_pass == pytest.approx(KNOWN["host_s_per_layer_pass"], rel=1e-3)
    # the unseen PP2 and PP2 x VP2 x DP2 then predict their host time as written
    for name in ("pp2", "pp2dp2vp2"):
        ctx = Context.of(c[name])
        assert breakdown(ctx, replace(got, core_share=1.0)).host_s == pytest.approx(
            breakdown(ctx, fit).host_s, rel=2e-3), name


def test_without_a_pipeline_layout_the_prior_stays(cfgs):
    tmp, c = cfgs
    got = joint_fit(tmp, c, ("tp2", "dp2", "tp2dp2"), _fit(None), "no_pipe")
    assert got.host_s_per_chunk_pass is None


def test_which_layouts_give_the_chunk_pass_alone(cfgs):
    _, c = cfgs
    runs = {n: (Context.of(c[n]), None) for n in c}
    rest, pipe = _pipelines([runs[n] for n in ("tp2", "dp2", "tp2dp2", "pp2vp2")])
    assert pipe == [runs["pp2vp2"]] and runs["pp2vp2"] not in rest and len(rest) == 3
    # a pipeline whose ranks share cores gives no such figure: it fits as before
    every = [runs[n] for n in ("tp2", "pp2dp2vp2")]
    assert _pipelines(every) == (every, [])
    # nor where every layout has a pipeline, or where another has one that fits the sends
    every = [runs[n] for n in ("pp2", "pp2vp2")]
    assert _pipelines(every) == (every, [])
    every = [runs[n] for n in ("tp2", "pp2dp2vp2", "pp2vp2")]
    assert _pipelines(every) == (every, [])


def test_a_pipeline_layout_without_host_gaps_fits_no_chunk_pass(cfgs):
    """A summary that measured no host gaps (a published summary's form) gives nothing: the
    prior stays, and the other layouts fit as without it."""
    tmp, c = cfgs
    fit = _fit(7e-4)
    names = ("tp2", "dp2", "tp2dp2", "pp2vp2")
    folders = {k: synthetic_profile(tmp / f"profile_{k}_nohost", c[k], fit) for k in names}
    items = [(calibrate.from_profile(folders[k], c[k]), c[k]) for k in names]
    items[-1] = (replace(items[-1][0], host_s=None), items[-1][1])
    got = calibrate.solve_joint(items)
    assert got.host_s_per_chunk_pass is None
    assert got.host_s_per_layer_pass == pytest.approx(
        joint_fit(tmp, c, names[:-1], fit, "nohost_ref").host_s_per_layer_pass, rel=1e-9)
