"""The DP replicas' waiting for the slowest of them (model revision 11): where a DP group's ranks
run on different cores or devices, each replica's work between two synchronisations takes its own
core's time and the faster wait at the gradient collectives. The waiting is its own part of the
exposed DP (`Fitted.dp_peer_wait` of the rest of the step, `step.peer_wait_s`), the transport is
fitted to the collectives' time less it (`Summary.dp_transfer_s`), and a summary that did not
measure it leaves the transport carrying it, as before. Round trips on synthetic profiles the
planner writes of its own prediction with known constants; the profile reader on a committed
measured profile."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, predict
from llama31_405b.planner.calibrate import graphed
from llama31_405b.planner.calibrate.synthetic import synthetic_profile
from llama31_405b.planner.context import Context
from llama31_405b.planner.calibrate.solver import dp_figure
from llama31_405b.planner.costs import dp_peers_on_one_core
from llama31_405b.planner.step import breakdown
from test_planner_core_share import config

REPO = Path(__file__).resolve().parents[1]
KNOWN = dict(attention_bf16_fraction=0.09, elementwise_passes=31.0, host_s_per_layer_pass=0.004,
             gemm_fraction=(("fp32", 0.3),), collective_latency_s=0.005,
             nvlink_bus_efficiency=0.2, shared_compute_share=0.6, dp_peer_wait=0.04)
MEASURED = REPO / "docs" / "planner_proof" / "2026-12-06T0833Z" / "layouts" / "tp2dp2"


def joint_fit(tmp: Path, cfgs: dict, names, fit, tag: str):
    """A joint calibration of synthetic profiles of the layouts `names` (of `cfgs`), each written
    with the constants `fit` into tmp/profile_<name>_<tag>: the round trip the joint fit's tests
    take."""
    folders = {k: synthetic_profile(tmp / f"profile_{k}_{tag}", cfgs[k], fit) for k in names}
    return calibrate.solve_joint([(calibrate.from_profile(folders[k], cfgs[k]), cfgs[k])
                                  for k in names])


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """TP2 and DP2 (2 ranks), TP2 x DP2, DP4 and PP2 x DP2 (4 ranks on the 2 cores), synthetic
    profiles of TP2, DP2 and TP2 x DP2 with the known constants."""
    tmp = tmp_path_factory.mktemp("peer_wait")
    fit = replace(calibrate.fitted(), **KNOWN)
    shapes = {"tp2": (2, 2, 1, 4), "dp2": (2, 1, 1, 2), "tp2dp2": (4, 2, 1, 4),
              "dp4": (4, 1, 1, 2), "pp2dp2": (4, 1, 2, 4)}
    cfgs = {k: load_config(config(tmp, k, *v)) for k, v in shapes.items()}
    assert [(c.parallel.tp, c.parallel.pp, c.derived.dp) for c in cfgs.values()] == [
        (2, 1, 1), (1, 1, 2), (2, 1, 2), (1, 1, 4), (1, 2, 2)]
    folders = {k: synthetic_profile(tmp / f"profile_{k}", cfgs[k], fit)
               for k in ("tp2", "dp2", "tp2dp2")}
    return fit, cfgs, folders


def test_dp_peers_share_a_core_only_where_a_whole_stage_is_pinned_to_it(layouts):
    fit, cfgs, _ = layouts
    ctxs = {k: Context.of(c) for k, c in cfgs.items()}
    k = {n: breakdown(ctx, fit).core_share for n, ctx in ctxs.items()}
    assert k == {"tp2": 1.0, "dp2": 1.0, "tp2dp2": 2.0, "dp4": 2.0, "pp2dp2": 2.0}
    # PP2 x DP2: each core runs one stage's two replicas (parallel/cores.py: stage order)
    assert {n: dp_peers_on_one_core(ctx, k[n]) for n, ctx in ctxs.items()} == {
        "tp2": False, "dp2": False, "tp2dp2": False, "dp4": False, "pp2dp2": True}
    unpinned = replace(ctxs["pp2dp2"], system=replace(ctxs["pp2dp2"].system, pin_ranks=False))
    assert not dp_peers_on_one_core(unpinned, 2.0)


def test_the_waiting_is_its_share_of_the_rest_of_the_step(layouts):
    fit, cfgs, _ = layouts
    for name in ("dp2", "tp2dp2", "dp4"):
        ctx = Context.of(cfgs[name])
        b, none = breakdown(ctx, fit), breakdown(ctx, replace(fit, dp_peer_wait=None))
        assert b.dp_peer_wait_s == pytest.approx(0.04 * (b.step_s - b.dp_exposed_s), rel=1e-9)
        assert b.dp_peer_wait_s == pytest.approx(0.04 * (none.step_s - none.dp_exposed_s),
                                                 rel=1e-9), name
        assert b.step_s == pytest.approx(none.step_s + b.dp_peer_wait_s, rel=1e-12)
        assert b.dp_exposed_s == pytest.approx(none.dp_exposed_s + b.dp_peer_wait_s, rel=1e-12)
        assert b.dp_total_s == none.dp_total_s      # the transfer is the transport's alone
        assert b.as_dict()["dp_peer_wait_s"] == b.dp_peer_wait_s
    # no DP, or a DP group on one core: nothing to wait for
    for name in ("tp2", "pp2dp2"):
        b = breakdown(Context.of(cfgs[name]), fit)
        assert b.dp_peer_wait_s == 0.0
        assert b.step_s == breakdown(Context.of(cfgs[name]), replace(fit, dp_peer_wait=None)).step_s


def test_a_summary_s_transfer_is_its_dp_time_less_the_waiting():
    s = replace(calibrate.CALIBRATION, dp_total_s=0.03, waiting=(("DP", 0.01), ("TP", 0.5)))
    assert s.dp_transfer_s == pytest.approx(0.02)
    assert replace(s, waiting=(("TP", 0.5),)).dp_transfer_s == 0.03      # DP's not measured
    assert replace(s, waiting=(("DP", 0.05),)).dp_transfer_s == 0.0       # never below 0
    assert replace(s, dp_total_s=None).dp_transfer_s is None


def test_a_profile_s_waits_for_peers_are_read_by_kind():
    """A measured profile (committed): its analysis' waits for peers, the dimensions the planner
    models (TP, DP; the other groups' left out), and the DP transfer less the DP waiting."""
    folder = MEASURED / "r1"
    cfg = load_config(MEASURED / "config.toml")
    waits = json.loads((folder / "analysis.json").read_text())["waiting_for_peers"]
    assert set(waits) == {"DP", "TP", "other"}
    s = calibrate.from_profile(folder, cfg)
    assert dict(s.waiting) == {"DP": waits["DP"], "TP": waits["TP"]}
    assert s.dp_transfer_s == pytest.approx(s.dp_total_s - waits["DP"], rel=1e-12)
    assert 0 < s.dp_transfer_s < s.dp_total_s


def test_profiles_give_the_waiting_and_the_transport_back(layouts):
    fit, cfgs, folders = layouts
    runs = [(calibrate.from_profile(folders[k], cfgs[k]), cfgs[k]) for k in ("tp2dp2", "tp2", "dp2")]
    assert dict(runs[0][0].waiting)["DP"] > 0 and runs[1][0].waiting == ()
    got = calibrate.solve_joint(runs)
    assert got.dp_peer_wait == pytest.approx(0.04, rel=1e-5)
    assert (got.collective_latency_s, got.nvlink_bus_efficiency) == pytest.approx((0.005, 0.2),
                                                                                  rel=1e-5)
    # DP4 (groups spanning the cores) and PP2 x DP2 (each on one core), not fitted, predicted
    # as the known constants predict them
    for name in ("dp4", "pp2dp2"):
        want, have = predict(cfgs[name], fit), predict(cfgs[name], got)
        assert have.step_time_s == pytest.approx(want.step_time_s, rel=1e-5), name
    # one layout alone: DP2 at 2 ranks, each on a core of its own
    alone = calibrate.solve(*runs[2])
    assert alone.dp_peer_wait == pytest.approx(0.04, rel=1e-5)


def test_without_the_waiting_measured_the_transport_carries_it(layouts):
    """A summary from before the waits were recorded (or the published one): no waiting fitted,
    the DP collectives' whole time is the transport's, and the fit still closes the step."""
    _, cfgs, folders = layouts
    c = replace(calibrate.from_profile(folders["dp2"], cfgs["dp2"]), waiting=())
    got = calibrate.solve(c, cfgs["dp2"])
    assert got.dp_peer_wait is None
    b = breakdown(Context.of(cfgs["dp2"]), got)
    assert b.dp_peer_wait_s == 0.0
    assert b.step_s == pytest.approx(c.step_s, rel=1e-6)
    assert calibrate.fitted().dp_peer_wait is None


def test_a_graphed_profile_s_waiting_shrinks_with_its_exposed_time():
    s = replace(calibrate.CALIBRATION, step_s=0.1, host_s=0.01, exposed=(("DP", 0.02),),
                dp_total_s=0.02, waiting=(("DP", 0.01),))
    r = graphed.as_replayed(s, 0.8)   # 20 ms saved: the 10 ms of host gaps, then half the DP
    assert dict(r.exposed)["DP"] == pytest.approx(0.01)
    assert dict(r.waiting)["DP"] == pytest.approx(0.005)
    assert r.dp_transfer_s == pytest.approx(0.005)


def test_one_waiting_per_step_on_every_pipeline_rank(layouts):
    """PP2 x DP2 with every rank on a core of its own (a GPU's case: a device each): the waiting
    is the step's, of the critical rank's rest, the same on both pipeline ranks, whose
    components each add up to the one step."""
    fit, cfgs, _ = layouts
    ctx = Context.of(cfgs["pp2dp2"])
    ctx = replace(ctx, system=replace(ctx.system, pin_ranks=False, shared_cores=0))
    ranks = [breakdown(ctx, fit, r) for r in range(2)]
    none = breakdown(ctx, replace(fit, dp_peer_wait=None))
    assert ranks[0].dp_peer_wait_s == ranks[1].dp_peer_wait_s > 0
    assert ranks[0].step_s == pytest.approx(ranks[1].step_s, rel=1e-12)
    assert ranks[0].step_s == pytest.approx(none.step_s + ranks[0].dp_peer_wait_s, rel=1e-12)


def test_the_transport_keeps_the_turns_of_a_group_on_one_core(layouts):
    """Only where the model prices the waiting apart is it taken off the transport's figure:
    PP2 x DP2 pinned (each DP group on one core) keeps its collectives' whole time."""
    fit, cfgs, _ = layouts
    s = replace(calibrate.CALIBRATION, dp_total_s=0.03, waiting=(("DP", 0.01),))
    assert dp_figure(Context.of(cfgs["pp2dp2"]), s, fit) == 0.03
    assert dp_figure(Context.of(cfgs["tp2dp2"]), s, fit) == pytest.approx(0.02)
