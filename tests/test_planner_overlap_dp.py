"""Overlapped DP under model revision 19: the passes' host time while a DP collective runs reads
as exposed DP (a profile counts a piece with communication and no compute as communication);
an overlapped collective takes a fitted time per bucket beyond its latency and bytes
(`Fitted.overlap_dp_s`), fitted by a joint fit from its overlapped layouts alone; the waits in
a DP collective (that time, and `shared_core_dp_s`) take nothing from the compute they overlap;
and the distributed optimizer's parameter all-gather moves the parameters' dtype. Round trips on
synthetic profiles the planner writes of its own prediction with known constants."""
from __future__ import annotations

from dataclasses import replace

import pytest

from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, comm, predict, simulate
from llama31_405b.planner.calibrate.joint import overlapped
from llama31_405b.planner.context import Context
from llama31_405b.planner.costs import plan
from llama31_405b.planner.step import breakdown
from test_planner_core_share import config
from test_planner_peer_wait import KNOWN, joint_fit

OVERLAP = "\n[performance]\noverlap_grad_reduce = true\noverlap_param_gather = true\n" \
          "ddp_bucket_size = 32768\n"


@pytest.fixture(scope="module")
def cfgs(tmp_path_factory):
    """TP2 and DP2 (2 ranks, nothing overlapped), DP2 with the GB200 settings' DP (overlapped,
    32,768-element buckets) and DP2 x PP2 with it, in FP32."""
    tmp = tmp_path_factory.mktemp("overlap_dp")
    out = {"tp2": config(tmp, "tp2", 2, 2, 1, 4), "dp2": config(tmp, "dp2", 2, 1, 1, 2)}
    for name, ranks, pp, minibs in (("ovdp2", 2, 1, 2), ("ovpp2dp2", 4, 2, 4)):
        path = config(tmp, name, ranks, 1, pp, minibs)
        path.write_text(path.read_text() + OVERLAP)
        out[name] = path
    return tmp, {k: load_config(v) for k, v in out.items()}


def _fit(ov: float | None):
    return replace(calibrate.fitted(), **KNOWN, overlap_dp_s=ov)


def test_covered_counts_the_dp_streams_seconds_inside_a_pass():
    busy = [(0.0, 1.0), (2.0, 3.0), (5.0, 6.0)]
    assert simulate.covered(busy, 0, 0.5, 2.5) == pytest.approx(1.0)
    assert simulate.covered(busy, 1, 0.5, 2.5) == pytest.approx(0.5)
    assert simulate.covered(busy, 0, 3.0, 5.0) == 0.0
    assert simulate.covered(busy, 0, -1.0, 10.0) == pytest.approx(3.0)


def test_host_time_under_a_dp_collective_is_exposed_dp_and_the_step_keeps_it(cfgs):
    _, c = cfgs
    fit = _fit(0.001)
    ov = Context.of(c["ovdp2"])
    b = breakdown(ov, fit)
    s = simulate.run(plan(ov, replace(fit, core_share=b.core_share)), ov.microbatches)
    assert 0 < b.dp_host_s == pytest.approx(s.host_under_dp_s, rel=1e-12)
    assert b.dp_exposed_s >= b.dp_host_s
    assert b.host_s + b.dp_host_s == pytest.approx(s.host_s, rel=1e-12)
    assert b.step_s - b.dp_peer_wait_s == pytest.approx(s.step_s, rel=1e-9)
    # nothing overlapped: the DP collectives run while nothing else does
    plain = breakdown(Context.of(c["dp2"]), fit)
    assert plain.dp_host_s == 0.0


def test_an_overlapped_collective_takes_the_fitted_time_per_bucket(cfgs):
    _, c = cfgs
    ov, plain = Context.of(c["ovdp2"]), Context.of(c["dp2"])
    assert overlapped(ov) and not overlapped(plain)
    assert comm.dp_waits_s(ov, _fit(0.002), 7) == pytest.approx((0.014, 0.014))
    assert comm.dp_waits_s(ov, _fit(None), 7) == (0.0, 0.0)
    assert comm.dp_waits_s(plain, _fit(0.002), 7) == (0.0, 0.0)
    for f in (comm.dp_reduce_s, comm.dp_gather_s):
        more, none = f(ov, 1e6, _fit(0.002), buckets=5), f(ov, 1e6, _fit(None), buckets=5)
        assert more - none == pytest.approx(5 * 0.002, rel=1e-12), f.__name__
        assert f(plain, 1e6, _fit(0.002), 5) == f(plain, 1e6, _fit(None), 5), f.__name__
    # ranks sharing cores add their own fixed time too (revision 15), both waits
    shared = replace(_fit(0.002), shared_core_dp_s=0.003, core_share=2.0)
    assert comm.dp_waits_s(ov, shared, 2) == pytest.approx((0.010, 0.010))


def test_the_waits_take_nothing_from_the_compute_they_overlap(cfgs):
    _, c = cfgs
    ov = Context.of(c["ovdp2"])
    p0, p1 = plan(ov, _fit(None)), plan(ov, _fit(0.002))
    assert p0.dp_work_share == (1.0,)
    row = p1.chunks[0]
    waits = sum(sum(comm.dp_waits_s(ov, _fit(0.002), ch.buckets)) for ch in row)
    total = sum(ch.reduce_s + ch.gather_s for ch in row)
    assert p1.dp_work_share[0] == pytest.approx(1 - waits / total, rel=1e-12)
    ch = row[0]
    # a collective takes its share of the cores for the share of its time that is transfer:
    # on average that share times the work share, which the passes it overlaps lose
    u = p1.dp_work_share[0]
    assert 0 < u < 1
    alike = replace(p0, sm_share=p0.sm_share * u, hbm_share=p0.hbm_share * u,
                    nvlink_share=p0.nvlink_share * u)
    assert p1.inflation(ch.bwd, ch.work_bwd) == pytest.approx(
        alike.inflation(ch.bwd, ch.work_bwd), rel=1e-12)
    assert 0 < p1.inflation(ch.bwd, ch.work_bwd) < p0.inflation(ch.bwd, ch.work_bwd)


def test_the_parameter_gather_moves_the_parameters_dtype(cfgs):
    _, c = cfgs
    fp32 = Context.of(c["dp2"])
    assert comm.param_gather_bytes_per_param(fp32) == comm.param_bytes(fp32) == 4.0
    gb200 = Context.of(load_config(config.__globals__["REPO"] / "configs" / "tiny_cpu_gb200.toml"))
    assert gb200.cfg.precision.params == "bf16" and comm.param_bytes(gb200) == 2.0


@pytest.mark.parametrize("known", [0.0015, None])
def test_a_joint_fit_gives_the_overlapped_collectives_time_back(cfgs, known):
    tmp, c = cfgs
    fit = _fit(known)
    got = joint_fit(tmp, c, ("tp2", "dp2", "ovdp2"), fit, str(known))
    assert got.overlap_dp_s == pytest.approx(known or 0.0, rel=1e-4, abs=1e-8)
    # the other constants come from the layouts without overlap, as without the third layout
    two = joint_fit(tmp, c, ("tp2", "dp2"), fit, f"{known}_two")
    for name in ("collective_latency_s", "nvlink_bus_efficiency", "host_s_per_layer_pass"):
        assert getattr(got, name) == pytest.approx(getattr(two, name), rel=1e-9), name
    # PP2 x DP2 with the same overlap, not fitted, predicted as the known constants predict it
    want, have = predict(c["ovpp2dp2"], fit), predict(c["ovpp2dp2"], got)
    assert have.step_time_s == pytest.approx(want.step_time_s, rel=1e-3)


def test_where_only_overlapped_layouts_have_dp_they_fit_the_transport_as_before(cfgs):
    """A joint fit of TP2 and overlapped DP2 (no other layout with DP), and of two overlapped
    layouts: no overlapped collective's time is fitted, and the transport takes its DP figure
    from the overlapped layout as it did before revision 19."""
    tmp, c = cfgs
    for names in (("tp2", "ovdp2"), ("ovdp2", "ovpp2dp2")):
        got = joint_fit(tmp, c, names, _fit(0.0015), "only_" + "_".join(names))
        assert got.overlap_dp_s is None, names
    # TP2 and overlapped DP2 written with no overlapped time: the transport comes back
    got = joint_fit(tmp, c, ("tp2", "ovdp2"), _fit(None), "none_tp2_ovdp2")
    assert got.overlap_dp_s is None
    assert got.collective_latency_s == pytest.approx(KNOWN["collective_latency_s"], rel=1e-3)
    assert got.nvlink_bus_efficiency == pytest.approx(KNOWN["nvlink_bus_efficiency"], rel=1e-3)
