"""Model revision 23: a CPU probe's GEMM ratio priced at the layout's own LM-head shard
(vocabulary / TP), a rung per shard the fit layouts probed (planner/calibrate/precisions.py
`shard_rungs`, compute.probe_factor). Every probe figure here is made up: an AVX2-like CPU whose
BF16 LM head is 20x FP32 at a 2,048 shard (TP 2) and 25x at 4,096 (TP 1)."""
from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, compute
from llama31_405b.planner.calibrate.precisions import shard_rungs, with_probe
from llama31_405b.planner.context import Context

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "tiny_cpu.toml"
GB200_CPU = REPO / "configs" / "tiny_cpu_gb200.toml"


def _ctx(path: Path, tp: int, **batch) -> Context:
    return Context.of(load_config(path, validate=False, overrides={
        "parallel": {"tp": tp, "pp": 1, "vp": 1}, "batch": {"minibs": 8, **batch}}))


def _summary(bf16_over_fp32: float):
    probe = {"gemm_fp32": 0.01, "gemm_bf16": 0.01 * bf16_over_fp32}
    return replace(calibrate.CALIBRATION, probe_s=tuple(sorted(probe.items())))


def test_each_shard_the_fit_probed_gets_its_own_rung():
    """Fit layouts at TP 2 (shard 2,048: ratios 19, 20 and 21) and TP 1 (4,096: 25): a rung
    each, the median of its own layouts; the overall "gemm" ratio stays the median of all four
    (of the inverse ratios, as `ratios` takes it)."""
    runs = [(_ctx(TINY, 2), _summary(19)), (_ctx(TINY, 2), _summary(20)),
            (_ctx(TINY, 2), _summary(21)), (_ctx(TINY, 1), _summary(25))]
    assert shard_rungs(runs, "fp32") == pytest.approx({"gemm-v2048_bf16": 20,
                                                       "gemm-v4096_bf16": 25})
    fit = replace(calibrate.fitted(), gemm_fraction=(("fp32", 0.3),))
    scale = dict(with_probe(fit, runs).probe_scale)
    assert scale["gemm_bf16"] == pytest.approx(1 / statistics.median(
        [1 / 19, 1 / 20, 1 / 21, 1 / 25]))
    assert scale["gemm-v2048_bf16"] == pytest.approx(20)
    assert scale["gemm-v4096_bf16"] == pytest.approx(25)


def test_one_shard_gives_no_rung_and_the_median_stays():
    runs = [(_ctx(TINY, 2), _summary(19)), (_ctx(TINY, 2), _summary(20)),
            (_ctx(TINY, 2), _summary(21))]
    assert shard_rungs(runs, "fp32") == {}
    fit = replace(calibrate.fitted(), gemm_fraction=(("fp32", 0.3),))
    assert dict(with_probe(fit, runs).probe_scale) == pytest.approx({"gemm_bf16": 20})
    # runs without a probe (a GPU profile) add no shard
    assert shard_rungs([(_ctx(TINY, 1), calibrate.CALIBRATION), *runs], "fp32") == {}


def test_a_layout_is_priced_at_its_own_shard():
    """The GB200 settings' BF16 LM head at TP 1 takes the 4,096 rung, at TP 2 the 2,048 one,
    at TP 4 (1,024) the nearest, 2,048; the emulated NVFP4 linears keep their own ratio
    (gemm_nvfp4: no rung); without rungs the "gemm" ratio, as before revision 23."""
    fit = replace(calibrate.fitted(), gemm_fraction=(("fp32", 0.3),), probe_scale=(
        ("gemm-v2048_bf16", 20.0), ("gemm-v4096_bf16", 25.0), ("gemm_bf16", 21.0),
        ("gemm_nvfp4", 1.7)))
    plain = replace(fit, probe_scale=(("gemm_bf16", 21.0), ("gemm_nvfp4", 1.7)))
    for tp, factor in ((1, 25.0), (2, 20.0), (4, 20.0)):
        ctx = _ctx(GB200_CPU, tp)
        assert compute.probe_factor(ctx, fit, "gemm", "bf16") == pytest.approx(factor), tp
        assert compute.probe_factor(ctx, plain, "gemm", "bf16") == pytest.approx(21.0)
        assert compute.probe_factor(ctx, fit, "gemm", "nvfp4") == pytest.approx(1.7)
        assert compute.part_factors(ctx, fit)["logits"] == pytest.approx(factor)
    one = _ctx(GB200_CPU, 1)
    st = next(s for s in one.stages if s.logits)
    assert (compute.stage_parts(one, st, fit).logits / compute.stage_parts(one, st, plain).logits
            == pytest.approx(25 / 21))
