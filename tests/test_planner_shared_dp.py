"""The fixed time of a DP collective among ranks sharing cores (model revision 15,
`Fitted.shared_core_dp_s`): added to each bucket's gradient reduce-scatter and parameter
all-gather (once per chunk under revision 15) where the layout's ranks share cores, nowhere else, and fitted by a joint
fit from its layout whose ranks share cores (TP2 x DP2) once the transport's latency and
bandwidth come from TP2 x DP2's TP and DP2's DP (the bytes' rate per rank of a layout whose
ranks each have a core). Round trips on synthetic profiles the planner writes of its own
prediction with known constants."""
from __future__ import annotations

from dataclasses import replace

import pytest

from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, comm, predict
from llama31_405b.planner.calibrate.synthetic import synthetic_profile
from llama31_405b.planner.context import Context
from llama31_405b.planner.step import breakdown
from test_planner_core_share import config
from test_planner_peer_wait import KNOWN

SHAPES = {"tp2": (2, 2, 1, 4), "dp2": (2, 1, 1, 2), "tp2dp2": (4, 2, 1, 4), "dp4": (4, 1, 1, 2),
          "pp2dp2": (4, 1, 2, 4)}


@pytest.fixture(scope="module")
def cfgs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shared_dp")
    return tmp, {k: load_config(config(tmp, k, *v)) for k, v in SHAPES.items()}


def _fit(f: float | None):
    return replace(calibrate.fitted(), **KNOWN, shared_core_dp_s=f)


def test_the_fixed_time_is_added_per_bucket_collective_where_ranks_share_cores(cfgs):
    _, c = cfgs
    ctx, fit = Context.of(c["dp4"]), _fit(0.003)
    params = 1e6
    for f in (comm.dp_reduce_s, comm.dp_gather_s):
        shared = f(ctx, params, replace(fit, core_share=2.0))
        alone = f(ctx, params, replace(fit, core_share=1.0))
        none = f(ctx, params, replace(fit, core_share=2.0, shared_core_dp_s=None))
        assert shared - none == pytest.approx(0.003, rel=1e-12), f.__name__
        assert alone == pytest.approx(none, rel=1e-12), f.__name__
        # each bucket's collective takes it (model revision 16: the buckets megatron-core lays)
        more = f(ctx, params, replace(fit, core_share=2.0), buckets=5)
        fewer = f(ctx, params, replace(fit, core_share=2.0, shared_core_dp_s=None), buckets=5)
        assert more - fewer == pytest.approx(5 * 0.003, rel=1e-12), f.__name__
    # the breakdown resolves the layout's core share: DP4 on the 2 cores shares, DP2 does not
    assert breakdown(ctx, fit).dp_total_s > breakdown(ctx, _fit(None)).dp_total_s
    two = Context.of(c["dp2"])
    assert breakdown(two, fit).dp_total_s == breakdown(two, _fit(None)).dp_total_s


@pytest.mark.parametrize("known", [0.003, None])
def test_a_joint_fit_gives_the_fixed_time_and_the_transport_back(cfgs, known):
    tmp, c = cfgs
    fit = _fit(known)
    folders = {k: synthetic_profile(tmp / f"profile_{k}_{known}", c[k], fit)
               for k in ("tp2dp2", "tp2", "dp2")}
    runs = [(calibrate.from_profile(folders[k], c[k]), c[k]) for k in ("tp2dp2", "tp2", "dp2")]
    got = calibrate.solve_joint(runs)
    assert got.shared_core_dp_s == pytest.approx(known or 0.0, rel=1e-5, abs=1e-9)
    assert (got.collective_latency_s, got.nvlink_bus_efficiency) == pytest.approx(
        (KNOWN["collective_latency_s"], KNOWN["nvlink_bus_efficiency"]), rel=1e-5)
    # DP4 (one group over both cores) and PP2 x DP2 (each group on one core), not fitted,
    # predicted as the known constants predict them
    for name in ("dp4", "pp2dp2"):
        want, have = predict(c[name], fit), predict(c[name], got)
        assert have.step_time_s == pytest.approx(want.step_time_s, rel=1e-5), name


def test_one_layout_alone_fits_no_fixed_time(cfgs):
    """A single profile (TP2 x DP2 alone) has no layout whose ranks each have a core: its DP
    collectives' whole time is the transport's, as before revision 15."""
    tmp, c = cfgs
    folder = synthetic_profile(tmp / "profile_alone", c["tp2dp2"], _fit(0.003))
    got = calibrate.solve(calibrate.from_profile(folder, c["tp2dp2"]), c["tp2dp2"])
    assert got.shared_core_dp_s is None
