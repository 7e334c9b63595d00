"""Parts in another precision than the fitted one (model revisions 6-8): the LM head runs in the
parameters' precision under FP8 and NVFP4 (megatron-core's output layer is outside the recipes),
and a CPU profile's precision probe prices the precisions it did not run, the whole part (rate
and time per call), the attention at the layout's bmm batch, elementwise work on BF16
activations and the emulated NVFP4 linears' quantisation
(planner/calibrate/precisions.py, profile/probe.py)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, compute
from llama31_405b.planner.calibrate.file import read as read_calibration
from llama31_405b.planner.calibrate.precisions import ratios, with_probe
from llama31_405b.planner.calibrate.read_profile import probe_seconds
from llama31_405b.planner.calibrate.synthetic import synthetic_profile
from llama31_405b.planner.context import Context
from llama31_405b.profile.probe import run_probe, shapes
from test_planner_calibrate import tiny  # a tiny CPU config of a layout

REPO = Path(__file__).resolve().parents[1]
GB200_CPU = REPO / "configs" / "tiny_cpu_gb200.toml"
GB200_128 = REPO / "configs" / "config_GB200_2048x4x8xtp4pp8cp2.toml"
PROBE = {"gemm_fp32": 0.01, "gemm_bf16": 0.2, "attention_fp32": 0.003, "attention_bf16": 0.027}
"""A CPU without BF16 units: BF16 GEMMs 20x and the attention 9x slower than FP32."""


def test_lm_head_runs_in_the_parameters_precision_under_low_precision_recipes():
    gb = Context.of(load_config(GB200_128))
    assert (gb.precision, gb.cfg.precision.params) == ("nvfp4", "bf16")
    assert compute.part_precision(gb, "logits") == "bf16"
    assert {compute.part_precision(gb, p) for p in ("qkv", "proj", "ffn_up", "ffn_down")} == {"nvfp4"}
    cpu = Context.of(load_config(GB200_CPU))  # emulated NVFP4: its linears execute in FP32
    assert compute.part_precision(cpu, "logits") == "bf16"
    assert compute.part_precision(cpu, "qkv") == "fp32"
    fp32 = Context.of(load_config(REPO / "configs" / "tiny_cpu.toml"))
    assert {compute.part_precision(fp32, p) for p in ("qkv", "logits")} == {"fp32"}
    # the GB200 LM head at BF16's peak and fraction, not NVFP4's
    fit = calibrate.fitted()
    M, N, K = compute.gemm_shapes(gb)["logits"]
    bf16 = compute.gemm_passes(gb, M, N, K, fit, "logits")
    fp4 = compute.gemm_passes(gb, M, N, K, fit, "ffn_up")
    assert bf16[0] / fp4[0] == pytest.approx(
        gb.system.peak_tflops("nvfp4") * fit.nvfp4_gemm_peak_fraction
        / (gb.system.peak_tflops("bf16") * compute.gemm_peak_fraction("bf16", fit)), rel=0.05)


def test_probe_times_both_precisions_on_the_runs_shapes():
    cfg = load_config(GB200_CPU)
    assert shapes(cfg) == {"gemm": [256, 128, 4096], "attention": [1, 4, 2, 256, 32],
                           "attention-b2": [2, 2, 256, 32], "attention-b4": [4, 2, 256, 32],
                           "attention-b8": [8, 2, 256, 32], "attention-b16": [16, 2, 256, 32],
                           "elementwise": [256, 128, 352], "ffn": [256, 128, 704]}
    p = run_probe(cfg, repeats=1)
    ops = ("gemm", "attention", "attention-b2", "attention-b4", "attention-b8", "attention-b16",
           "elementwise", "ffn")
    assert set(p["seconds"]) == {f"{o}_{q}" for o in ops for q in ("fp32", "bf16")} | {"ffn_nvfp4"}
    assert all(s > 0 for s in p["seconds"].values()) and p["threads"] >= 1
    assert probe_seconds([{"rank": 1}, {"rank": 0, "precision_probe": p}]) == tuple(
        sorted(p["seconds"].items()))
    assert probe_seconds([{"rank": 0, "precision_probe": None}]) == ()


def test_probe_prices_the_precisions_the_fit_did_not_run():
    cfg = load_config(GB200_CPU)
    ctx = Context.of(cfg)
    c = replace(calibrate.CALIBRATION, probe_s=tuple(sorted(PROBE.items())))
    assert ratios([(ctx, c)], "gemm", "fp32") == {"bf16": pytest.approx(0.05)}
    fit = replace(calibrate.fitted(), gemm_fraction=(("fp32", 0.3),), attention_bf16_fraction=0.1,
                  call_s=(("attention", 0.001), ("logits", 0.002)))
    assert cfg.precision.attention == "bf16"  # a BF16 attention fit prices FP32's 9x faster
    got = with_probe(fit, [(ctx, c)])
    assert dict(got.attention_fraction) == pytest.approx({"fp32": 0.1})
    assert dict(got.probe_scale) == pytest.approx({"attention_fp32": 1 / 9, "gemm_bf16": 20})
    # an FP32 fit prices the gb200 layout's BF16 LM head 20x and its BF16 attention 9x: the
    # whole part, its time per call (Fitted.call_s) with its rate (model revision 8)
    fp32 = Context.of(load_config(REPO / "configs" / "tiny_cpu.toml"))
    priced = with_probe(fit, [(fp32, c)])
    assert dict(priced.gemm_fraction) == pytest.approx({"fp32": 0.3, "bf16": 0.3})
    assert dict(priced.probe_scale) == pytest.approx({"attention_bf16": 9, "gemm_bf16": 20})
    same = replace(priced, probe_scale=())
    for a, b in zip(compute.chunk_parts(ctx, 2, False, True, priced),
                    compute.chunk_parts(ctx, 2, False, True, same)):
        assert a.logits / b.logits == pytest.approx(20) and b.logits > 0
        assert a.attention / b.attention == pytest.approx(9) and b.attention > 0
        assert a.ffn_up == b.ffn_up and a.elementwise == b.elementwise
    st = next(s for s in ctx.stages if s.logits)
    assert (compute.stage_parts(ctx, st, priced).logits
            / compute.stage_parts(ctx, st, same).logits) == pytest.approx(20)
    # without a probe (a GPU profile, an older one) the fit is unchanged
    assert with_probe(fit, [(ctx, calibrate.CALIBRATION)]) == fit


def test_the_ladder_prices_each_layouts_attention_batch_and_bf16_activations():
    """Model revision 7: the probe's ladder prices a layout's attention at its own bmm batch
    (microbatch x heads per TP rank; the nearest rung in log2), and elementwise work on BF16
    activations at the probe's elementwise ratio; revision 8: the emulated NVFP4 linears'
    quantisation as elementwise work, (ratio - 1) x their time. An FP32 layout keeps the
    fitted rates."""
    probe = dict(PROBE, **{"attention-b2_fp32": 0.002, "attention-b2_bf16": 0.01,
                           "attention-b4_fp32": 0.004, "attention-b4_bf16": 0.04,
                           "attention-b8_fp32": 0.008, "attention-b8_bf16": 0.12,
                           "elementwise_fp32": 0.001, "elementwise_bf16": 0.002,
                           "ffn_fp32": 0.001, "ffn_bf16": 0.02, "ffn_nvfp4": 0.004})
    fp32 = Context.of(load_config(REPO / "configs" / "tiny_cpu.toml"))
    c = replace(calibrate.CALIBRATION, probe_s=tuple(sorted(probe.items())))
    fit = replace(calibrate.fitted(), gemm_fraction=(("fp32", 0.3),), attention_bf16_fraction=0.1)
    priced = with_probe(fit, [(fp32, c)])
    assert dict(priced.probe_scale) == pytest.approx(
        {"attention_bf16": 9, "attention-b2_bf16": 5, "attention-b4_bf16": 10,
         "attention-b8_bf16": 15, "elementwise_bf16": 2, "gemm_bf16": 20, "gemm_nvfp4": 4})
    plain = replace(priced, probe_scale=())
    # tiny_cpu_gb200: 4 heads, BF16 attention and parameters; its batch at TP 1 is mbs x 4
    for mbs, tp, slower in ((1, 1, 10), (2, 1, 15), (4, 1, 15), (1, 2, 5), (2, 2, 10)):
        ctx = Context.of(load_config(GB200_CPU, validate=False, overrides={
            "batch": {"micro_batch_size": mbs, "minibs": 8}, "parallel": {"tp": tp}}))
        assert compute.probe_factor(ctx, priced, "attention", "bf16") == pytest.approx(slower)
        f, _ = compute.chunk_parts(ctx, 2, False, False, priced)
        f0, _ = compute.chunk_parts(ctx, 2, False, False, plain)
        assert f.attention / f0.attention == pytest.approx(slower), (mbs, tp)
        # BF16 activations 2x; the emulated linears' quantisation 3x their time, elementwise
        linears = f0.qkv + f0.proj + f0.ffn_up + f0.ffn_down
        assert f.elementwise == pytest.approx(2 * f0.elementwise + 3 * linears)
        assert f.ffn_up == f0.ffn_up and linears > 0
    # an FP32 layout: nothing applies
    assert compute.part_factors(fp32, priced) == dict.fromkeys(
        ("qkv", "proj", "ffn_up", "ffn_down", "logits", "attention", "elementwise"), 1.0) | {
        "quantisation": 0.0}
    assert compute.chunk_parts(fp32, 2, False, False, priced) == compute.chunk_parts(
        fp32, 2, False, False, plain)


def test_a_profiles_probe_reaches_the_calibration_file(tmp_path):
    """The round trip: a synthetic FP32 profile with a probe in rank 0's record calibrates to
    BF16 fractions priced by it, written to the file and read back."""
    cfg = load_config(tiny(tmp_path, "tp2dp4", tp=2, pp=1, minibs=2))
    fit = replace(calibrate.fitted(), gemm_fraction=(("fp32", 0.3),), attention_bf16_fraction=0.09,
                  host_s_per_layer_pass=0.004, collective_latency_s=0.005,
                  nvlink_bus_efficiency=0.2)
    folder = synthetic_profile(tmp_path / "synthetic", cfg, fit)
    (folder / "ranks").mkdir(exist_ok=True)
    (folder / "ranks" / "rank00000.json").write_text(json.dumps(
        {"rank": 0, "cuda_graphs": False, "precision_probe": {"seconds": PROBE}}))
    summary = calibrate.from_profile(folder, cfg)
    assert dict(summary.probe_s) == PROBE
    got = calibrate.solve(summary, cfg)
    g = dict(got.gemm_fraction)
    assert g["bf16"] == pytest.approx(g["fp32"], rel=1e-9)
    assert g["fp32"] == pytest.approx(0.3, rel=1e-6)
    assert dict(got.attention_fraction)["bf16"] == pytest.approx(got.attention_bf16_fraction)
    assert dict(got.probe_scale) == pytest.approx({"attention_bf16": 9, "gemm_bf16": 20})
    path = calibrate.write(tmp_path / "cal.toml", summary, got, "fp32", {})
    back = read_calibration(path)
    assert back.fit == got and dict(back.summary.probe_s) == PROBE


def test_a_summary_names_the_rank_its_compute_describes(tmp_path):
    """The published figures are read on an inner pipeline rank (compute_of = "inner"), a
    profile's on its busiest; any other value is refused at load, naming the file and the key."""
    assert calibrate.CALIBRATION.compute_of == "inner"
    text = calibrate.PUBLISHED.read_text().replace('compute_of = "inner"', 'compute_of = "middle"')
    bad = tmp_path / "published.toml"
    bad.write_text(text)
    with pytest.raises(ValueError, match=r"published.toml: compute_of = 'middle'.*busiest.*inner"):
        calibrate.load_summary(bad)
