"""Every constant of the performance model, in one place: the published figures it is fitted to,
the assumptions it makes, and the fit.

Three kinds of numbers live here and nowhere else:

* `CALIBRATION`: the one published measurement the model is fitted to, the 128-rack step of
  FACTS.md section 1 (GB200 NVL72, TP4-PP8-VP8-CP2, DP 128, MiniBS 8, GBS 1024, NVFP4).
* `ASSUMED`: engineering priors that are *not* fitted (collective latencies, SM share of NCCL,
  tile shape, ...). Each says where it comes from. Changing one changes the fit.
* `Fitted` (computed by `fitted()`): the constants solved in closed form so that the model
  reproduces the calibration step exactly; each field names the figure it came from.

No other published result (MFU at DP 8, the 7.07 and 18.79 minute scores, 83% scaling) enters
the model: those are predictions, tested in tests/test_planner.py and bench/planner_vs_published.py.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache


@dataclass(kw_only=True, frozen=True, slots=True)
class CalibrationPoint:
    system: str = "gb200-nvl72"
    racks: int = 128
    tp: int = 4
    pp: int = 8
    vp: int = 8
    cp: int = 2
    minibs: int = 8
    step_s: float = 1.27
    """FACTS 1: one step at GBS 1024 takes about 1.27 s."""
    compute_s: float = 0.733
    """FACTS 1: ~57% compute (~733 ms)."""
    gemm_share_of_compute: float = 0.74
    """FACTS 1: GEMMs 74% of compute."""
    ffn_share_of_compute: float = 0.54
    """FACTS 1: FFN up/down GEMMs ~54% of compute."""
    dp_exposed_s: float = 0.016 * 1.27
    """FACTS 1: cross-rack DP traffic ~1.6% (~20 ms) of the step."""


CALIBRATION = CalibrationPoint()


@dataclass(kw_only=True, frozen=True, slots=True)
class Assumed:
    gemm_tile_m: int = 128
    gemm_tile_n: int = 256
    """Output tile of one CTA (CUTLASS/cuBLAS Blackwell and Hopper kernels use 128x256 class
    tiles); the wave-quantisation factor counts tiles against SMs."""
    gemm_peak_fraction: tuple[tuple[str, float], ...] = (("bf16", 0.75), ("fp8", 0.65), ("fp32", 0.5))
    """Best achievable fraction of the dense peak for a large GEMM, for precisions the calibration
    run does not use (NVFP4's is fitted). Typical of cuBLAS on H100/B200 (BF16 ~75%, FP8 ~65%)."""
    nvlink_latency_s: float = 12e-6
    """Per-collective latency of an NCCL all-gather/reduce-scatter inside an NVLink domain."""
    p2p_latency_s: float = 15e-6
    """Per-message latency of a pipeline send/recv (NCCL p2p, includes the schedule's wait)."""
    cp_step_overhead_s: float = 40e-6
    """Per ring step of context-parallel attention: kernel launches, the KV exchange's sync and
    the partial-softmax correction that cannot hide behind the attention kernel."""
    scaleout_latency_s: float = 30e-6
    """Per-collective latency across racks (InfiniBand, a few hops)."""
    scaleout_bus_efficiency: float = 0.8
    """Achieved fraction of the per-GPU scale-out bandwidth by large DP collectives."""
    nccl_dp_ctas: int = 16
    """SMs NCCL's overlapped DP collectives occupy (one CTA per channel, 16 channels); compute
    slows by this share of the SMs while they run."""
    tp_overlap_hidden: float = 0.6
    """Share of TP communication hidden when performance.tp_comm_overlap is on (TE userbuffers)."""
    optimizer_bytes_per_param: float = 30.0
    """Adam with FP32 master weights reads master, grad, m, v and writes master, m, v, param."""
    optimizer_fixed_s: float = 2e-3
    """Multi-tensor-apply launches, grad-norm all-reduce and clipping per step."""
    memory_reserved_gb: float = 10.0
    """Per GPU memory outside the model's tensors: CUDA context (~1 GB), NCCL buffers of about ten
    communicators (TP, CP, PP, DP, DP x CP, embedding, ...), cuBLAS/TE workspaces, the memory
    pools of the per-layer CUDA graphs and caching-allocator slack."""
    activation_fragmentation: float = 0.2
    """Memory lost to the caching allocator on the activations, as a share of them. Weights,
    gradients and optimizer state live in Megatron's contiguous buffers, allocated once; the
    activations are allocated and freed every microbatch, in mixed sizes (BF16 tensors, NVFP4
    data and scale tensors) and in the interleaved schedule's order, and with per-layer CUDA
    graphs they sit in private pools that eager allocations cannot reuse. Allocator studies of
    LLM training report 10-30% of reserved memory lost to fragmentation; 20% of the activations
    is a middle value. The planner's memory verdicts depend on it (docs/planner.md: "Memory
    headroom")."""
    run_overhead_s: float = 5.0
    """run_start to the first step's start plus run_stop bookkeeping (the untimed warm-up
    iterations already captured CUDA graphs and built the data index)."""
    eval_micro_batch_size: int = 1
    """Microbatch of the evaluation forward passes."""


ASSUMED = Assumed()


@dataclass(kw_only=True, frozen=True, slots=True)
class Fitted:
    nvfp4_gemm_peak_fraction: float
    """NVFP4 GEMM efficiency (fraction of the dense FP4 peak before wave quantisation), from
    'FFN up/down GEMMs ~54% of compute' of the 733 ms."""
    attention_bf16_fraction: float
    """Fused attention efficiency (executed causal FLOPs / BF16 peak), from 'GEMMs 74% of
    compute' minus the FFN and the other linear layers (the fused attention kernels are counted
    as GEMMs)."""
    elementwise_passes: float
    """Bytes moved by non-GEMM kernels (norms, SwiGLU, RoPE, quantisation, residuals, loss),
    in units of one BF16 pass over a layer's activations, from the 26% of compute that is not
    GEMM."""
    tp_bus_efficiency: float
    """Achieved fraction of NVLink bandwidth by the sequence-parallel all-gathers and
    reduce-scatters, from closing the 1.27 s step."""
    dp_exposed_tail: float
    """Share of the DP reduce-scatter/all-gather time that stays exposed (the last buckets and
    the first parameter gather), from 'cross-rack DP ~1.6% of the step'."""


# Values used while solving (the fit needs the model; the model needs these).
NEUTRAL = Fitted(nvfp4_gemm_peak_fraction=1.0, attention_bf16_fraction=1.0, elementwise_passes=1.0,
                 tp_bus_efficiency=1.0, dp_exposed_tail=0.0)


@cache
def fitted() -> Fitted:
    """Solve the fitted constants from CALIBRATION (closed form, a few microseconds, cached)."""
    from . import compute, step
    from .spec import make_config

    c = CALIBRATION
    cfg = make_config(c.system, c.racks, tp=c.tp, pp=c.pp, vp=c.vp, cp=c.cp, minibs=c.minibs)
    ctx = step.Context.of(cfg)
    m = cfg.batch.minibs // cfg.batch.micro_batch_size
    # DP first: the exposed tail share, then the compute slowdown while the rest overlaps.
    dp = step.dp_comm_s(ctx)
    tail = c.dp_exposed_s / dp
    slowdown = ASSUMED.nccl_dp_ctas / ctx.system.sm_count * (dp - c.dp_exposed_s)
    base = (c.compute_s - slowdown) / m  # per microbatch, without the slowdown
    fit = replace(NEUTRAL, dp_exposed_tail=tail)
    for _ in range(4):  # the slowest pipeline rank can change with the constants: iterate
        stage = step.critical(ctx, fit)[0]
        unit = compute.stage_parts(ctx, stage, NEUTRAL)  # seconds at efficiency 1, one pass
        ffn_target = c.ffn_share_of_compute * base
        eta_fp4 = unit.ffn / ffn_target
        other_gemm = (unit.qkv + unit.proj + unit.logits) / eta_fp4
        attn_target = c.gemm_share_of_compute * base - ffn_target - other_gemm
        if attn_target <= 0:
            raise ValueError("calibration: the GEMM share leaves no time for attention")
        fit = replace(fit, nvfp4_gemm_peak_fraction=eta_fp4,
                      attention_bf16_fraction=unit.attention / attn_target,
                      elementwise_passes=(1 - c.gemm_share_of_compute) * base / unit.elementwise)
        # TP bandwidth closes the step: step = (1 + bubble) * busy + DP + optimizer.
        b = step.breakdown(ctx, fit)
        busy = (c.step_s - b.dp_exposed_s - b.optimizer_s) / (1 + b.bubble_fraction)
        tp_target = busy - b.compute_total_s - b.cp_s - b.pp_s  # compute includes the slowdown
        bw, lat = step.tp_comm_parts(ctx, fit)
        if tp_target <= lat:
            raise ValueError("calibration: no time left for TP communication")
        fit = replace(fit, tp_bus_efficiency=bw / (tp_target - lat))
    return fit
