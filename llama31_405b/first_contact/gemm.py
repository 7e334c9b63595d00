"""The layer phase's matrix products: the GPU's BF16 and FP8 ceilings and the four linear GEMMs of
one TP4 shard in BF16 and FP8, each beside the system's dense peak (its system file) and the
planner's assumption for it (planner.compute).

- Ceiling (`ceiling`): an n x n x n product (n = 8192) on random data, median of 50 after 5
  warm-ups, BF16 through `torch.matmul`, FP8 through `torch._scaled_mm` (E4M3 operands, one
  scale per tensor, BF16 output, fast accumulation). The planner's assumption for the same
  product: `planner.compute.gemm_passes` (the precision's peak x its achievable fraction x the
  wave efficiency of the output tiles).
- TP4 shard (`shard_gemms`): the shapes `planner.compute.gemm_shapes` gives for the HGX H200
  layout (TP4, CP2, MBS 1: M = 4,096 tokens per rank): QKV 16384 -> 4608, output projection
  4096 -> 16384, FC1 16384 -> 26624, FC2 13312 -> 16384. Each linear's three GEMMs are timed
  apart as the planner counts them (forward (M, N, K), data gradient (M, K, N), weight gradient
  (N, K, M); operands row-major A [m, k] and B [n, k], product A B^T); rate = 6 M N K / their
  summed time; the planner's three times are `planner.compute.part_passes` of that config, the
  same ones its step prediction uses. FP8 as Transformer Engine 2.20.2's per-tensor recipes
  run it (`transformer_engine.common.recipe.Float8CurrentScaling` and `DelayedScaling`: fprop
  without the split accumulator, i.e. fast accumulation; dgrad and wgrad with it), all operands
  E4M3 (TE's HYBRID format gives the gradient operand E5M2; not timed here).
- FP8 operands are quantized with a per-tensor scale (amax -> 448, E4M3's largest) and the
  product's relative error against the BF16 product of the same data is reported, so a wrong
  scale shows.

Timing: CUDA events on a GPU; `time.perf_counter` on the CPU (where `torch._scaled_mm` also
runs, so the unit tests take the same path at small shapes; CPU times mean nothing)."""
from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NotRequired, TypeAlias, TypedDict, cast

if TYPE_CHECKING:   # torch is imported where it is used
    import torch

    from ..planner.context import Context

CEILING_N = 8192
PASSES = ("fwd", "dgrad", "wgrad")
PRECISIONS = ("bf16", "fp8")
LINEARS = ("qkv", "proj", "ffn_up", "ffn_down")
E4M3_MAX = 448.0
"""The largest finite float8_e4m3fn (torch.finfo(torch.float8_e4m3fn).max)."""


Operand: TypeAlias = "torch.Tensor | tuple[torch.Tensor, torch.Tensor]"
"""An operand as `operands` makes it: a BF16 tensor, or an (E4M3 tensor, scale) pair for FP8."""


class LinearPlan(TypedDict):
    mnk: list[int]
    passes_s: dict[str, float]


class Assumed(TypedDict):
    """What the planner assumes for one precision's GEMMs (planner_assumption)."""
    tokens: int
    peak_tflops: float
    peak_fraction: float
    ceiling_s: float
    linears: dict[str, LinearPlan]


class Ceiling(TypedDict):
    """The n^3 product's figures (ceiling)."""
    precision: str
    n: int
    median_s: float
    tflops: float
    spread: float
    rel_error_vs_bf16: NotRequired[float]
    """FP8 only."""


class AgainstPlanner(TypedDict):
    """A shard_gemms row beside the planner's assumption (against_planner)."""
    share_of_peak: float
    planner_passes_s: dict[str, float]
    planner_tflops: float
    measured_over_planner: float


class GemmRow(TypedDict):
    """One linear in one precision (shard_gemms), then beside the planner (against_planner)."""
    mnk: list[int]
    passes_s: dict[str, float]
    flops: float
    seconds: NotRequired[float]
    tflops: NotRequired[float]
    rel_error_vs_bf16: NotRequired[float]
    """FP8 only."""
    share_of_peak: NotRequired[float]
    planner_passes_s: NotRequired[dict[str, float]]
    planner_tflops: NotRequired[float]
    measured_over_planner: NotRequired[float]


def pass_shapes(M: int, N: int, K: int) -> dict[str, tuple[int, int, int]]:
    """(m, n, k) of a (M tokens, N outputs, K inputs) linear's forward, data-gradient and
    weight-gradient GEMMs, in planner.compute._gemm_passes' order."""
    return {"fwd": (M, N, K), "dgrad": (M, K, N), "wgrad": (N, K, M)}


def gemm_flops(m: int, n: int, k: int) -> float:
    return 2.0 * m * n * k


def planner_context(system: str, precision: str) -> Context:
    """The planner's Context of the HGX H200 layout (TP4, CP2, MBS 1) on `system`."""
    from ..planner.context import Context
    from ..planner.spec import make_config
    return Context.of(make_config(system, 1, tp=4, pp=1, vp=1, cp=2, minibs=1,
                                  precision=precision))


def planner_assumption(system: str, precision: str) -> Assumed:
    """What the planner assumes for `precision` GEMMs on `system`: the dense peak, the
    achievable fraction, the n^3 ceiling product's time, and per linear of the TP4 shard its
    (M, N, K) and the seconds of its three GEMMs (planner.compute.part_passes)."""
    from ..planner import compute
    from ..planner.calibrate import fitted
    ctx, fit = planner_context(system, precision), fitted()
    shapes, passes = compute.gemm_shapes(ctx), compute.part_passes(ctx, fit)
    n = CEILING_N
    return {"tokens": ctx.tokens, "peak_tflops": ctx.system.peak_tflops(precision),
            "peak_fraction": compute.gemm_peak_fraction(compute.gemm_precision(ctx), fit),
            "ceiling_s": compute.gemm_passes(ctx, n, n, n, fit)[0],
            "linears": {k: {"mnk": list(shapes[k]), "passes_s": dict(zip(PASSES, passes[k]))}
                        for k in LINEARS}}


def quantize_e4m3(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 tensor, FP32 dequantization scale): one scale for the whole tensor, amax -> 448."""
    import torch
    amax = t.abs().amax().float().clamp_min(1e-12)
    q = (t.float() * (E4M3_MAX / amax)).to(torch.float8_e4m3fn)
    return q, (amax / E4M3_MAX).reshape(())


def operands(m: int, n: int, k: int, precision: str, *, device: str = "cuda", seed: int = 0
             ) -> tuple[Operand, Operand]:
    """A [m, k] and B [n, k] on `device` (row-major; the product is A B^T): BF16 tensors, or
    (E4M3 tensor, scale) pairs for FP8."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=g)
    if precision == "bf16":
        return a, b
    return quantize_e4m3(a), quantize_e4m3(b)


def product(a: Operand, b: Operand, precision: str, *, fast_accum: bool = True,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """A B^T in `precision` (operands as `operands` makes them), BF16 result."""
    import torch
    if precision == "bf16":   # BF16 tensors (operands)
        return torch.matmul(cast(torch.Tensor, a), cast(torch.Tensor, b).t(), out=out)
    (qa, sa), (qb, sb) = cast(tuple[torch.Tensor, torch.Tensor], a), cast(
        tuple[torch.Tensor, torch.Tensor], b)   # (E4M3 tensor, scale) pairs (operands)
    # torch._scaled_mm: mat2 column-major (the transpose of a row-major [n, k]); the scales
    # multiply the product (dequantization scales)
    return torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                            use_fast_accum=fast_accum)


def median_seconds(fn: Callable[[], object], *, iters: int, warmup: int, device: str
                   ) -> tuple[float, float]:
    """(median seconds of fn(), (max - min) / median) over `iters` calls after `warmup`."""
    import torch
    times: list[float] = []
    for i in range(warmup + iters):
        if device == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            dt: float = s.elapsed_time(e) / 1e3   # Any: torch 2.13 leaves Event unannotated
        else:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    t = statistics.median(times)
    return t, (max(times) - min(times)) / t


def rel_error_vs_bf16(a: Operand, b: Operand, m: int, n: int, k: int, *, device: str,
                      seed: int) -> float:
    """Relative error of the FP8 product of (a, b) against the BF16 product of the same data
    (FP32 accumulation of both in the norm)."""
    ab, bb = operands(m, n, k, "bf16", device=device, seed=seed)
    ref = product(ab, bb, "bf16").float()
    got = product(a, b, "fp8").float()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def ceiling(precision: str, *, n: int = CEILING_N, iters: int = 50, warmup: int = 5,
            device: str = "cuda") -> Ceiling:
    """The n^3 matrix product's median time and TFLOP/s in `precision` (module docstring)."""
    import torch
    pairs = [operands(n, n, n, precision, device=device, seed=s) for s in range(2)]
    out = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    state = {"i": 0}

    def step() -> None:
        a, b = pairs[state["i"] % 2]
        state["i"] += 1
        product(a, b, precision, out=out if precision == "bf16" else None)

    t, spread = median_seconds(step, iters=iters, warmup=warmup, device=device)
    res: Ceiling = {"precision": precision, "n": n, "median_s": t,
                    "tflops": gemm_flops(n, n, n) / t / 1e12, "spread": spread}
    if precision == "fp8":
        a, b = pairs[0]
        res["rel_error_vs_bf16"] = rel_error_vs_bf16(a, b, n, n, n, device=device, seed=0)
    del pairs, out
    if device == "cuda":
        torch.cuda.empty_cache()
    return res


def shard_gemms(shapes: Mapping[str, Sequence[int]], *, precisions: Sequence[str] = PRECISIONS,
                iters: int = 10, warmup: int = 3, device: str = "cuda",
                on_row: Callable[[str, str, GemmRow], None] | None = None
                ) -> dict[str, dict[str, GemmRow]]:
    """Each linear of `shapes` ((M, N, K) by name) in each precision: the seconds of its three
    GEMMs (`pass_shapes`), its FLOPs (6 M N K) and TFLOP/s; FP8 rows also the relative error
    against BF16 of the forward product. `on_row(name, precision, row)` is called after each
    row (the phase writes its report there)."""
    import torch
    rows: dict[str, dict[str, GemmRow]] = {}
    for name, (M, N, K) in shapes.items():
        for prec in precisions:
            row: GemmRow = {"mnk": [M, N, K], "passes_s": {}, "flops": 6.0 * M * N * K}
            for i, (p, (m, n, k)) in enumerate(pass_shapes(M, N, K).items()):
                a, b = operands(m, n, k, prec, device=device, seed=i)
                # TE's FP8 recipes: fprop fast accumulation, dgrad and wgrad the split one
                row["passes_s"][p], _ = median_seconds(
                    functools.partial(product, a, b, prec, fast_accum=p == "fwd"),
                    iters=iters, warmup=warmup, device=device)
                if prec == "fp8" and p == "fwd":
                    row["rel_error_vs_bf16"] = rel_error_vs_bf16(a, b, m, n, k, device=device,
                                                                 seed=i)
                del a, b
            row["seconds"] = sum(row["passes_s"].values())
            row["tflops"] = row["flops"] / row["seconds"] / 1e12
            rows.setdefault(name, {})[prec] = row
            if on_row is not None:
                on_row(name, prec, row)
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def against_planner(row: GemmRow, assumed: Assumed, name: str) -> AgainstPlanner:
    """A shard_gemms row's figures beside the planner's `assumed` (planner_assumption) for the
    same linear: share of the dense peak, the planner's seconds and TFLOP/s, measured rate over
    the planner's."""
    plan = assumed["linears"][name]
    plan_s = sum(plan["passes_s"].values())
    return {"share_of_peak": row["tflops"] / assumed["peak_tflops"],
            "planner_passes_s": plan["passes_s"], "planner_tflops": row["flops"] / plan_s / 1e12,
            "measured_over_planner": plan_s / row["seconds"]}
