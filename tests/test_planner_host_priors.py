"""The host time's growth with the microbatch and its part per step (model revisions 13, 18): on a
CPU each layer pass takes `host_s_per_layer_token` more per token of the rank's microbatch, and
each step `host_s_per_step` outside the passes (stretched by the ranks per core, which all run
their step's end at once); both are system priors a calibration keeps, fitting the passes' fixed
part around them. The priors themselves are bench/host_priors.py's fit of the committed 2-rank
FP32 profiles (revision 18: DP, TP, PP and VP, the proof's unseen layouts left out): the test
re-fits them, so a changed prior or a changed profile fails here."""
from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest

from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, predict
from llama31_405b.planner.calibrate.constants import ASSUMED
from llama31_405b.planner.calibrate.synthetic import synthetic_profile
from llama31_405b.planner.context import Context
from llama31_405b.planner.costs import chunk_cost, plan
from llama31_405b.planner.step import breakdown
from test_planner_core_share import config

REPO = Path(__file__).resolve().parents[1]
# the transport's latency left at the system's prior: one DP layout fits the bandwidth alone
KNOWN = dict(host_s_per_layer_pass=0.004, nvlink_bus_efficiency=0.2)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """DP2 at microbatches of 1 and 4 sequences (2 ranks), DP4 (4 ranks on the 2 cores)."""
    tmp = tmp_path_factory.mktemp("host_priors")
    shapes = {"dp2": (2, 1, 1, 2, 1), "dp2mbs4": (2, 1, 1, 4, 4), "dp4": (4, 1, 1, 2, 1)}
    return tmp, {k: load_config(config(tmp, k, *v)) for k, v in shapes.items()}


def test_the_cpu_has_both_priors_and_a_gpu_neither(layouts):
    _, cfgs = layouts
    cpu = Context.of(cfgs["dp2"]).system
    assert (cpu.host_s_per_layer_token, cpu.host_s_per_step) == (6.6e-7, 0.0053)
    gpu = Context.of(load_config(REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml")).system
    assert (gpu.host_s_per_layer_token, gpu.host_s_per_step, gpu.host_s_per_layer_pass) == (0, 0, 0)


def test_a_pass_takes_more_host_time_per_token_of_the_microbatch(layouts):
    _, cfgs = layouts
    fit = replace(calibrate.fitted(), **KNOWN)
    one, four = (Context.of(cfgs[k]) for k in ("dp2", "dp2mbs4"))
    assert (one.tokens, four.tokens) == (256, 1024)
    # the whole model on one stage: 4 layers, the embedding and the loss counted as layers,
    # and the chunk pass's own 0.5 ms (model revision 22)
    h1, h4 = (chunk_cost(c, 0, 0, fit).host_fwd for c in (one, four))
    per_pass = 6.6e-7 * 256
    assert h1 == pytest.approx(6 * (0.004 + per_pass) + 5e-4, rel=1e-12)
    assert h4 - h1 == pytest.approx(6 * 3 * per_pass, rel=1e-12)


def test_the_host_time_per_step_stretches_with_the_ranks_per_core(layouts):
    _, cfgs = layouts
    fit = replace(calibrate.fitted(), **KNOWN)
    ctx = Context.of(cfgs["dp4"])
    for k in (1.0, 2.0):
        p = plan(ctx, replace(fit, core_share=k))
        assert p.host_step_s == pytest.approx(0.0053 * k, rel=1e-12)
        assert p.host_s == ASSUMED.host_step_overhead_s
    # DP4 pins two ranks to each core: twice the 5.3 ms, in the host time (a profile's host
    # gaps), not in the optimizer's, and in the step
    # (a key of its own: the plans and simulations are cached by the layout's key)
    without = replace(ctx, system=replace(ctx.system, host_s_per_step=0.0),
                      key=ctx.key + ("host_s_per_step 0",))
    b, b0 = breakdown(ctx, fit), breakdown(without, fit)
    assert b.core_share == 2.0
    assert b.host_s - b0.host_s == pytest.approx(0.0106, rel=1e-9)
    assert b.optimizer_s == pytest.approx(b0.optimizer_s, rel=1e-12)
    assert b.step_s - b0.step_s == pytest.approx(0.0106, rel=1e-9)


def test_a_calibration_fits_the_fixed_part_around_the_priors(layouts):
    """A synthetic DP2 profile at microbatch 1 with the known constants: the fit gives the known
    fixed part back, and at microbatch 4 the host time is the fixed part plus the prior's
    growth, per layer pass, plus the step's own."""
    tmp, cfgs = layouts
    fit = replace(calibrate.fitted(), **KNOWN)
    folder = synthetic_profile(tmp / "profile_dp2", cfgs["dp2"], fit)
    got = calibrate.solve(calibrate.from_profile(folder, cfgs["dp2"]), cfgs["dp2"])
    assert got.host_s_per_layer_pass == pytest.approx(0.004, rel=1e-5)
    ctx = Context.of(cfgs["dp2mbs4"])
    assert ctx.microbatches == 1
    passes = 1 * 6 * 2  # one microbatch, 4 layers + embedding + loss, forward and backward
    # and the one chunk's pass each way at the prior's 0.5 ms (model revision 22)
    want = passes * (0.004 + 1024 * 6.6e-7) + 2 * 5e-4 + 0.0053
    assert breakdown(ctx, got).host_s == pytest.approx(want, rel=1e-5)


def _host_priors():
    spec = importlib.util.spec_from_file_location("host_priors", REPO / "bench" / "host_priors.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_priors_are_the_fit_of_the_committed_two_rank_fp32_profiles(layouts):
    _, cfgs = layouts
    cpu = Context.of(cfgs["dp2"]).system
    mod = _host_priors()
    rows = mod.rows("2026-12-07T1030Z", "2026-12-06T2130Z")
    names = {name for name, *_ in rows}
    # one row per layout, DP, TP, PP and VP; the proof's unseen 2-rank layout (pp2) left out
    assert len(rows) == 13 and len({key for _, key, *_ in rows}) == 13
    assert {"dp2", "tp2", "pp2vp2m2", "tp2m1mbs8"} <= names and "pp2" not in names
    assert {key[:3] for _, key, *_ in rows} == {(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 2, 2)}
    f, h, b, fitted = mod.fit(rows)
    assert round(f - ASSUMED.host_step_overhead_s, 4) == cpu.host_s_per_step
    assert float(f"{b:.2g}") == cpu.host_s_per_layer_token
    assert 0.0007 < h < 0.001
    # every layout within 40 % of its fit, the DP ones within 15 %
    for (name, key, *_, got), pred in zip(rows, fitted):
        assert abs(got / pred - 1) < (0.15 if key[:3] == (1, 1, 1) else 0.4), name


def test_a_proof_run_folder_leaves_its_unseen_layouts_out_of_the_priors():
    mod = _host_priors()
    assert mod.unseen() >= {"pp2", "dp4", "gb200"}
    assert all(name != "pp2" for name, *_ in mod.rows("2026-12-07T1030Z", "2026-12-05"))
