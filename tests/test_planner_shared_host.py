"""The host time under model revision 18: where ranks share cores it stretches by their turns
and by what each core-mate adds (`Fitted.shared_host_extra`: planner costs.host_stretch), the
host time per layer pass fitted on the layouts whose ranks each have a core and the core-mates'
share on those whose ranks share cores (calibrate/joint.py); the emulated NVFP4 linears' Python
is priced per call (systems `host_s_per_emulated_linear`). Round trips on synthetic profiles the
planner writes of its own prediction with known constants."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, predict
from llama31_405b.planner.context import Context
from llama31_405b.planner.costs import chunk_cost, chunk_slots, host_stretch, plan
from llama31_405b.planner.step import breakdown
from test_planner_peer_wait import KNOWN, joint_fit
from test_planner_shared_dp import cfgs  # noqa: F401  (its layouts, as a fixture)

REPO = Path(__file__).resolve().parents[1]


def _fit(extra: float | None):
    return replace(calibrate.fitted(), **KNOWN, shared_host_extra=extra)


def test_host_time_stretches_by_the_turns_and_what_each_core_mate_adds(cfgs):
    _, c = cfgs
    assert host_stretch(_fit(0.5), 1.0) == 1.0 and host_stretch(_fit(None), 2.0) == 2.0
    assert host_stretch(_fit(0.5), 2.0) == pytest.approx(2.5, rel=1e-12)
    # DP4 does DP2's work per rank with two ranks to a core: its passes' and its step's host time
    dp2, dp4 = Context.of(c["dp2"]), Context.of(c["dp4"])
    one = chunk_cost(dp2, 0, 0, replace(_fit(0.5), core_share=1.0))
    for extra, want in ((0.5, 2.5), (None, 2.0)):
        shared = chunk_cost(dp4, 0, 0, replace(_fit(extra), core_share=2.0))
        assert shared.host_fwd == pytest.approx(want * one.host_fwd, rel=1e-12)
        assert shared.host_bwd == pytest.approx(want * one.host_bwd, rel=1e-12)
        step = plan(dp4, replace(_fit(extra), core_share=2.0)).host_step_s
        assert step == pytest.approx(want * dp4.system.host_s_per_step, rel=1e-12)
    # the breakdown resolves the layout's core share: DP2 (a core per rank) is unchanged
    assert breakdown(dp2, _fit(0.5)).host_s == pytest.approx(breakdown(dp2, _fit(None)).host_s)
    assert breakdown(dp4, _fit(0.5)).host_s > breakdown(dp4, _fit(None)).host_s


@pytest.mark.parametrize("known", [0.5, None])
def test_a_joint_fit_gives_the_pass_host_from_own_cores_and_the_core_mates_share_back(cfgs, known):
    tmp, c = cfgs
    fit = _fit(known)
    got = joint_fit(tmp, c, ("tp2dp2", "tp2", "dp2"), fit, str(known))
    assert got.shared_host_extra == pytest.approx(known or 0.0, rel=1e-4, abs=1e-7)
    assert got.host_s_per_layer_pass == pytest.approx(KNOWN["host_s_per_layer_pass"], rel=1e-4)
    # DP4 and PP2 x DP2, not fitted, predicted as the known constants predict them
    for name in ("dp4", "pp2dp2"):
        want, have = predict(c[name], fit), predict(c[name], got)
        assert have.step_time_s == pytest.approx(want.step_time_s, rel=1e-4), name


def test_the_fit_layouts_with_a_core_each_alone_fit_no_core_mates_share(cfgs):
    tmp, c = cfgs
    got = joint_fit(tmp, c, ("tp2", "dp2"), _fit(0.5), "own")
    assert got.shared_host_extra is None


def test_the_emulated_linears_python_is_priced_per_call_where_the_gemms_are_emulated(cfgs):
    _, c = cfgs
    fit = replace(_fit(None), core_share=1.0)
    gb200 = Context.of(load_config(REPO / "configs" / "tiny_cpu_gb200.toml"))
    assert gb200.precision == "nvfp4" and gb200.system.nvfp4 == "emulated"
    per_call = gb200.system.host_s_per_emulated_linear
    assert per_call == 7e-5
    without = replace(gb200, system=replace(gb200.system, host_s_per_emulated_linear=0.0),
                      key=gb200.key + ("no emulated linear host",))
    # every chunk of the pipeline: its transformer layers, 4 linears each, each way
    for rank in range(gb200.pp):
        for chunk in range(gb200.vp):
            layers = chunk_slots(gb200, rank, chunk)[0]
            a, b = chunk_cost(gb200, rank, chunk, fit), chunk_cost(without, rank, chunk, fit)
            assert a.host_fwd - b.host_fwd == pytest.approx(4 * layers * per_call, abs=1e-12)
            assert a.host_bwd - b.host_bwd == pytest.approx(4 * layers * per_call, abs=1e-12)
    assert sum(chunk_slots(gb200, r, ch)[0] for r in range(gb200.pp)
               for ch in range(gb200.vp)) == gb200.model.num_layers
    # FP32 linears are the host time per pass's own; a GPU prices none
    tiny = Context.of(c["dp2"])
    assert tiny.system.host_s_per_emulated_linear == 7e-5 and tiny.precision == "fp32"
    gpu = Context.of(load_config(REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"))
    assert gpu.system.host_s_per_emulated_linear == 0.0
