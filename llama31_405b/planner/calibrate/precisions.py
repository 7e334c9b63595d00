"""The precisions a profile did not run, priced by its precision probe.

A fit measures the GEMMs in the profiled run's precision (`compute.gemm_precision`) and the
attention in its `precision.attention`; a plan may run a part in another (tiny_cpu_gb200: the LM
head and the attention in BF16, its linears in emulated NVFP4, against an FP32 fit). On a GPU the
datasheet's peaks relate the precisions (`ASSUMED.gemm_peak_fraction` of each peak). On a CPU the
peaks say nothing of PyTorch's kernels for a precision the CPU has no units for (BF16 on AVX2:
some 20x slower than FP32, where the CPU system file's nominal peaks are equal), so a CPU
profile's rank 0 times the operations in each precision (profile/probe.py) and the fit prices a
part in precision q by its time in the measured precision p times the probe's ratio:

    t(part in q) = t(part in p) x t_probe(q) / t_probe(p)

the whole part: its rate and its time per call alike (`Fitted.call_s`; the probe times the
operation as the run calls it). So the fit keeps q's fraction of its peak at p's (scaled by
the peaks' ratio, 1 on the CPU) and records the ratio in `Fitted.probe_scale` ("<operation>_<q>";
`compute.probe_factor` applies it): "gemm" for linear parts in q (the LM head in BF16 under
NVFP4; "gemm-v<V>" at each vocabulary shard V the fit layouts probed, model revision 23, the
rung nearest a layout's shard), "attention-b<B>" at each rung of the probe's ladder of bmm
batches (the rung nearest a layout's mbs x heads / TP; "attention" where a probe had no
ladder), "elementwise" for the
non-GEMM work on activations in q (the parameters' precision), and "gemm_nvfp4" for the
emulated NVFP4 linear against the FP32 one ("ffn" in the probe): its quantisation, priced as
elementwise work of (ratio - 1) x the layer's linear time. Several layouts: the median ratio
over those with a probe. A profile without one (a GPU's, or one written before the probe)
leaves the fit as it was.

History: model revision 6 priced q's rate alone (fraction(q) = fraction(p) x t_probe(p) /
t_probe(q)), its time per call at p's; revision 7 added the ladder and the elementwise ratio
(T2205Z: tiny_cpu_gb200's LM head 1.34x its prediction, the FP32 fit's time per call being a
larger share of the LM head than in revision 6's runs; its elementwise 1.74x, the emulation's
quantisation unpriced).
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


def shard_rungs(runs: list[tuple[Context, Summary]], base: str) -> dict[str, float]:
    """Model revision 23: the LM head's probe ratio per vocabulary shard (vocabulary / TP: the
    shape each run's probe timed), "gemm-v<shard>_<precision>" -> the median over the runs of
    that shard, where the runs probed more than one shard ({} otherwise: the "gemm" ratio is
    the one shard's). On a CPU without BF16 units the ratio grows with the shard (docs/planner.md,
    "What the eighteenth set shows": 17.6-21.6 at 2,048, 22.6-31.1 at 4,096), so the median over
    the fit layouts priced a layout at TP 1 at a TP 2 layout's ratio."""
    by: dict[int, list[tuple[Context, Summary]]] = {}
    for ctx, c in runs:
        if c.probe_s:
            by.setdefault(ctx.vocab // ctx.tp, []).append((ctx, c))
    if len(by) < 2:
        return {}
    return {f"gemm-v{shard}_{prec}": 1 / r for shard, group in sorted(by.items())
            for prec, r in ratios(group, "gemm", base).items()}


def with_probe(fit: Fitted, runs: list[tuple[Context, Summary]]) -> Fitted:
    """`fit` with the precisions the runs' probes timed and the runs did not execute: their
    GEMM and attention fractions at the measured precision's (`Fitted.gemm_fraction`,
    `Fitted.attention_fraction`) and the probe's time ratios (`Fitted.probe_scale`)."""
    ctx = runs[0][0]
    peak = ctx.system.peak_tflops
    gemm = compute.gemm_precision(ctx)
    attention = ctx.cfg.precision.attention
    g, a, scale = dict(fit.gemm_fraction), dict(fit.attention_fraction), dict(fit.probe_scale)
    base = compute.gemm_peak_fraction(gemm, fit)
    for prec, r in ratios(runs, "gemm", gemm).items():
        g[prec] = base * peak(gemm) / peak(prec)
        scale[f"gemm_{prec}"] = 1 / r
    scale |= shard_rungs(runs, gemm)
    rungs = sorted({k.partition("_")[0] for _, c in runs for k, _ in c.probe_s
                    if k.startswith("attention-b")})
    for op in ("attention", *rungs):
        for prec, r in ratios(runs, op, attention).items():
            a[prec] = fit.attention_bf16_fraction * peak(attention) / peak(prec)
            scale[f"{op}_{prec}"] = 1 / r
    for prec, r in ratios(runs, "elementwise", ctx.cfg.precision.params).items():
        scale[f"elementwise_{prec}"] = 1 / r
    nvfp4 = ratios(runs, "ffn", gemm).get("nvfp4")
    if nvfp4 and gemm != "nvfp4":
        scale["gemm_nvfp4"] = 1 / nvfp4
    return replace(fit, gemm_fraction=tuple(sorted(g.items())),
                   attention_fraction=tuple(sorted(a.items())),
                   probe_scale=tuple(sorted(scale.items())))
