"""Model revision 21: an overlapped DP collective whose group has peers pinned to one core waits
for their turns at each step of its ring (`Fitted.overlap_peer_core_dp_s`), fitted by a joint
fit from such a layout given `overlap_dp_s` from one whose peers are apart; the DP replicas'
waiting is a share of the step less all of its exposed DP; a DP stream's transfer share counts
the all-gathers only where they run beside compute; gradients are reduced in the parameters'
dtype without `grad_reduce_in_fp32`. Round trips on synthetic profiles the planner writes of its
own prediction with known constants."""
from __future__ import annotations

from dataclasses import replace

import pytest

from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, comm
from llama31_405b.planner.calibrate.synthetic import synthetic_profile
from llama31_405b.planner.context import Context
from llama31_405b.planner.costs import plan
from llama31_405b.planner.step import breakdown
from test_planner_core_share import config
from test_planner_peer_wait import KNOWN, joint_fit

OVERLAP = "\n[performance]\noverlap_grad_reduce = true\noverlap_param_gather = true\n" \
          "ddp_bucket_size = 32768\n"
SHAPES = {"tp2": (2, 2, 1, 4), "dp2": (2, 1, 1, 2), "tp2dp2": (4, 2, 1, 4),
          "ovtp2dp2": (4, 2, 1, 4), "ovdp4": (4, 1, 1, 2), "ovpp2dp2": (4, 1, 2, 4),
          "ovdp2": (2, 1, 1, 2)}


@pytest.fixture(scope="module")
def cfgs(tmp_path_factory):
    """FP32 layouts without overlap (TP2, DP2, TP2 x DP2) and with the GB200 settings' DP
    (overlapped, 32,768-element buckets: TP2 x DP2, DP4, PP2 x DP2 and DP2)."""
    tmp = tmp_path_factory.mktemp("peer_core_dp")
    out = {}
    for name, shape in SHAPES.items():
        path = config(tmp, name, *shape)
        if name.startswith("ov"):
            path.write_text(path.read_text() + OVERLAP)
        out[name] = load_config(path)
    return tmp, out


def _fit(ov: float | None = 0.0015, peer: float | None = None):
    return replace(calibrate.fitted(), **KNOWN, overlap_dp_s=ov, overlap_peer_core_dp_s=peer)


def config_like(cfg, *, overlap: bool):
    """`cfg` with both of megatron-core's DP overlaps set to `overlap`."""
    perf = replace(cfg.performance, overlap_grad_reduce=overlap, overlap_param_gather=overlap)
    return replace(cfg, performance=perf)


def _k(ctx: Context) -> float:
    return breakdown(ctx, _fit()).core_share


def test_which_dp_groups_have_peers_on_one_core(cfgs):
    _, c = cfgs
    ctx = {n: Context.of(c[n]) for n in ("ovdp4", "ovpp2dp2", "ovtp2dp2", "ovdp2", "tp2")}
    # 4 ranks pinned two to a core in blocks of a stage's ranks, TP fastest: DP4's blocks are
    # DP peers, PP2 x DP2's a stage's two replicas, TP2 x DP2's TP pairs
    assert {n: _k(x) for n, x in ctx.items()} == {
        "ovdp4": 2.0, "ovpp2dp2": 2.0, "ovtp2dp2": 2.0, "ovdp2": 1.0, "tp2": 1.0}
    got = {n: comm.dp_peers_share_a_core(x, _k(x)) for n, x in ctx.items()}
    assert got == {"ovdp4": True, "ovpp2dp2": True, "ovtp2dp2": False, "ovdp2": False,
                   "tp2": False}
    # a system that pins nothing (every GPU) never has them
    gpu = ctx["ovdp4"]
    unpinned = replace(gpu, system=replace(gpu.system, pin_ranks=False))
    assert not comm.dp_peers_share_a_core(unpinned, 2.0)


def test_the_peer_cores_wait_is_per_ring_step_and_only_where_it_applies(cfgs):
    _, c = cfgs
    dp4, tp2dp2, dp2 = (Context.of(c[n]) for n in ("ovdp4", "ovtp2dp2", "ovdp2"))
    fit = replace(_fit(0.001, 0.002), core_share=2.0)
    # DP4: the fixed time a bucket, and 3 ring steps of the peers' wait, each way
    assert comm.dp_waits_s(dp4, fit, 5) == pytest.approx((5 * 0.007, 5 * 0.007))
    # TP2 x DP2's peers are on different cores: the fixed time alone
    assert comm.dp_waits_s(tp2dp2, fit, 5) == pytest.approx((0.005, 0.005))
    assert comm.dp_waits_s(dp2, replace(fit, core_share=1.0), 5) == pytest.approx((0.005, 0.005))
    # not fitted: nothing added
    assert comm.dp_waits_s(dp4, replace(fit, overlap_peer_core_dp_s=None), 5) == pytest.approx(
        (0.005, 0.005))
    # without overlap the collectives wait for none of it
    plain = Context.of(config_like(c["ovdp4"], overlap=False))
    assert comm.dp_waits_s(plain, fit, 5) == (0.0, 0.0)


@pytest.mark.parametrize("peer", [0.002, None])
def test_a_joint_fit_gives_the_peer_cores_wait_back(cfgs, peer):
    tmp, c = cfgs
    fit = _fit(0.0015, peer)
    names = ("tp2", "dp2", "tp2dp2", "ovtp2dp2", "ovdp4")
    got = joint_fit(tmp, c, names, fit, f"peer_{peer}")
    assert got.overlap_dp_s == pytest.approx(0.0015, rel=1e-3)
    assert (got.overlap_peer_core_dp_s or 0.0) == pytest.approx(peer or 0.0, rel=1e-3, abs=1e-7)
    # without the layout whose peers share a core, nothing of it is fitted
    apart = joint_fit(tmp, c, names[:-1], fit, f"apart_{peer}")
    assert apart.overlap_peer_core_dp_s is None
    assert apart.overlap_dp_s == pytest.approx(got.overlap_dp_s, rel=1e-6)


def test_where_every_overlapped_layouts_peers_share_a_core_they_give_the_fixed_time(cfgs):
    """As before revision 21: the layout fits `overlap_dp_s`, and no ring step's time."""
    tmp, c = cfgs
    got = joint_fit(tmp, c, ("tp2", "dp2", "tp2dp2", "ovdp4"), _fit(0.0015), "together")
    assert got.overlap_peer_core_dp_s is None
    assert got.overlap_dp_s == pytest.approx(0.0015, rel=1e-3)


@pytest.mark.parametrize("name", ["ovdp2", "ovtp2dp2"])
def test_the_replicas_waiting_round_trips_through_an_overlapped_profile(cfgs, name):
    """One profile of an overlapped layout written with a known waiting gives it back: the rest
    of the step it is a share of leaves out the host time under a DP collective, as the profile
    counts that time as exposed DP (the review of revisions 19 and 20: 0.046 and 0.044 back
    for 0.04 before revision 21)."""
    tmp, c = cfgs
    fit = _fit(0.0015)
    b = breakdown(Context.of(c[name]), fit)
    assert b.dp_host_s > 0 and b.dp_peer_wait_s > 0
    folder = synthetic_profile(tmp / f"wait_{name}", c[name], fit)
    got = calibrate.solve(calibrate.from_profile(folder, c[name]), c[name])
    assert got.dp_peer_wait == pytest.approx(KNOWN["dp_peer_wait"], rel=1e-6)


def test_the_transfer_share_leaves_out_gathers_that_run_after_the_optimizer(cfgs):
    _, c = cfgs
    cfg = c["ovdp2"]
    only_rs = replace(cfg, performance=replace(cfg.performance, overlap_param_gather=False))
    ctx = Context.of(only_rs)
    fit = _fit(0.002)
    row = plan(ctx, fit).chunks[0]
    assert all(ch.gather_s > 0 for ch in row)
    waits = sum(comm.dp_waits_s(ctx, fit, ch.buckets)[0] for ch in row)
    total = sum(ch.reduce_s for ch in row)
    assert comm.dp_work_share(ctx, fit, row) == pytest.approx(1 - waits / total, rel=1e-12)


def test_gradients_are_reduced_in_the_parameters_dtype_without_fp32_reduction(cfgs):
    _, c = cfgs
    cfg = c["dp2"]
    assert cfg.precision.params == "fp32"
    prec = cfg.precision
    for params, fp32, want in (("fp32", True, 4.0), ("fp32", False, 4.0), ("bf16", True, 4.0),
                               ("bf16", False, 2.0)):
        x = replace(cfg, precision=replace(prec, params=params, grad_reduce_in_fp32=fp32))
        assert comm.grad_bytes_per_param(Context.of(x)) == want, (params, fp32)
