"""The precisions a profile did not run, priced by its precision probe.

A fit measures the GEMMs in the profiled run's precision (`compute.gemm_precision`) and the
attention in its `precision.attention`; a plan may run a part in another (tiny_cpu_gb200: the LM
head and the attention in BF16 against an FP32 fit). On a GPU the datasheet's peaks relate the
precisions (`ASSUMED.gemm_peak_fraction` of each peak). On a CPU the peaks say nothing of
PyTorch's kernels for a precision the CPU has no units for (BF16 on AVX2: some 20x slower than
FP32, where the CPU system file's nominal peaks are equal), so a CPU profile's rank 0 times the
run's LM head and attention shapes in each precision (profile/probe.py) and the fit prices
precision q from the measured one p by the probe's time ratio:

    fraction(q) = fraction(p) x t_probe(p) / t_probe(q) x peak(p) / peak(q)

so that a part of q takes t_probe(q) / t_probe(p) times its time in p. Several layouts: the
median ratio over those with a probe. A profile without one (a GPU's, or one written before
the probe) leaves the fit as it was.

Model revision 7: the attention's ratio at each rung of the probe's ladder of bmm batches
(`attention_fraction` keys "<precision>-b<B>", read by `compute.attention_time` for a layout of
that batch), and the elementwise work's time in each other precision of the activations (the
parameters' precision) relative to the fit's, `Fitted.elementwise_scale`.
"""
from __future__ import annotations

import statistics
from dataclasses import replace

from .. import compute
from ..context import Context
from .constants import Fitted
from .summary import Summary


def ratios(runs: list[tuple[Context, Summary]], op: str, base: str) -> dict[str, float]:
    """Precision -> the median over the runs of t_probe(base) / t_probe(precision) for probe
    operation `op` (gemm, attention), for every precision other than `base` the probes timed."""
    out: dict[str, list[float]] = {}
    for _, c in runs:
        t = dict(c.probe_s)
        ref = t.get(f"{op}_{base}")
        if not ref:
            continue
        for key, s in t.items():
            o, _, prec = key.partition("_")
            if o == op and prec != base and s > 0:
                out.setdefault(prec, []).append(ref / s)
    return {p: statistics.median(v) for p, v in out.items()}


def with_probe(fit: Fitted, runs: list[tuple[Context, Summary]]) -> Fitted:
    """`fit` with the GEMM and attention fractions of the precisions the runs' probes timed and
    the runs did not execute (`Fitted.gemm_fraction`, `Fitted.attention_fraction`)."""
    ctx = runs[0][0]
    peak = ctx.system.peak_tflops
    gemm = compute.gemm_precision(ctx)
    attention = ctx.cfg.precision.attention
    g = dict(fit.gemm_fraction)
    base = compute.gemm_peak_fraction(gemm, fit)
    for prec, r in ratios(runs, "gemm", gemm).items():
        g[prec] = base * r * peak(gemm) / peak(prec)
    a = dict(fit.attention_fraction)
    rungs = sorted({k.partition("_")[0] for _, c in runs for k, _ in c.probe_s
                    if k.startswith("attention-b")})
    for op in ("attention", *rungs):
        suffix = op.removeprefix("attention")
        for prec, r in ratios(runs, op, attention).items():
            a[prec + suffix] = fit.attention_bf16_fraction * r * peak(attention) / peak(prec)
    e = dict(fit.elementwise_scale)
    for prec, r in ratios(runs, "elementwise", ctx.cfg.precision.params).items():
        e[prec] = 1 / r
    return replace(fit, gemm_fraction=tuple(sorted(g.items())),
                   attention_fraction=tuple(sorted(a.items())),
                   elementwise_scale=tuple(sorted(e.items())))
