"""Communication of one GPU: TP (sequence parallel), CP, pipeline sends and DP, each on the link
`topology` assigns it.

Per layer and microbatch with sequence parallelism, TP runs 2 all-gathers + 2 reduce-scatters
forward and about 6 backward (mirrors + input re-gathers for the weight gradients), each moving
(t-1)/t of the activation b*(s/c)*h*2 bytes; all on the critical path unless TE's TP overlap is
on. CP: a ring over CP ranks exchanging K and V (forward) and K, V plus their gradients
(backward), hidden behind the attention kernel except a per-step overhead. PP: one send per
microbatch and model chunk in each direction. DP: the distributed optimizer's gradient
reduce-scatter and parameter all-gather over the DP x CP ranks, hierarchical across racks.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from .calibrate.constants import ASSUMED, Fitted
from .context import Context
from .topology import (NVLINK, bandwidth, collective_s, cp_span, dp_cp_span, group_link, latency,
                       p2p_link, tp_span)

ACT_BYTES = 2.0  # BF16 activations on the wire


def param_bytes(ctx: Context) -> float:
    """Bytes of one element in the parameters' dtype: 4 for the CPU's FP32 runs, 2 for BF16
    parameters (every GPU config, and tiny_cpu_gb200 on the CPU). What an activation takes on
    the wire (`act_bytes`) and a parameter in the distributed optimizer's parameter buffer, which
    its all-gather moves (megatron-core 0.19.2 `_ParamAndGradBuffer`: the parameters' dtype;
    `param_gather_bytes_per_param`). Model revision 19: FP32 parameters had been gathered at 2
    bytes, half what they move (as the activations before revision 17)."""
    return 4.0 if ctx.cfg.precision.params == "fp32" else ACT_BYTES


def act_bytes(ctx: Context) -> float:
    """Bytes of one activation element on the wire (TP, CP, pipeline sends): the parameters'
    dtype (`param_bytes`), which the model builder gives megatron-core 0.19.2 as `params_dtype`
    and `pipeline_dtype` (`TransformerConfig`; the embedding's output and every layer's
    activations are in it, the low-precision recipes quantize only inside the linears). Model
    revision 17: the CPU's FP32 runs had been priced at 2 bytes, half what they send."""
    return param_bytes(ctx)


TP_FORWARD = 4
"""TP collectives of one layer's forward (sequence parallel: 2 all-gathers + 2 reduce-scatters;
without it 2 all-reduces, each counted as two)."""


def tp_collectives_per_layer(ctx: Context) -> int:
    """Collectives per layer and microbatch (forward + backward); all-reduces count as two."""
    if ctx.tp == 1:
        return 0
    return 10 if ctx.cfg.parallel.sequence_parallel else 8


def tp_bytes(ctx: Context) -> float:
    """Bytes each GPU gathers or scatters in one TP collective (the full activation)."""
    return ctx.tokens * ctx.model.hidden_size * act_bytes(ctx)


def tp_collective_s(ctx: Context, fit: Fitted) -> float:
    """One TP collective, exposed (after TE's overlap when it is on)."""
    if ctx.tp == 1:
        return 0.0
    t = collective_s(ctx, tp_bytes(ctx), tp_span(ctx), fit.nvlink_bus_efficiency)
    t *= fit.scale("comm_scale", "TP")
    return t * (1 - ASSUMED.tp_overlap_hidden) if ctx.cfg.performance.tp_comm_overlap else t


def tp_counts(ctx: Context, layers: int, embedding: bool, logits: bool) -> tuple[int, int]:
    """(forward, backward) TP collectives of one microbatch through a chunk. The embedding's
    vocabulary-parallel lookup adds a reduce-scatter forward and an all-gather backward; the
    output layer an all-gather forward and a reduce-scatter backward."""
    n = tp_collectives_per_layer(ctx)
    if not n:
        return 0, 0
    extra = int(embedding) + int(logits)
    return TP_FORWARD * layers + extra, (n - TP_FORWARD) * layers + extra


def cp_layer_s(ctx: Context, attention_s: float, fit: Fitted) -> tuple[float, float]:
    """Exposed CP communication of one layer and microbatch, (forward, backward): CP-1 ring steps
    each way, the KV transfer hidden behind that step's share of the attention kernel."""
    if ctx.cp == 1:
        return 0.0, 0.0
    m = ctx.model
    kv_heads = max(m.num_query_groups // ctx.tp, 1)
    kv = ctx.tokens * 2 * kv_heads * m.kv_channels * act_bytes(ctx)
    sp = cp_span(ctx)
    bw = bandwidth(ctx, group_link(sp), fit.nvlink_bus_efficiency)
    steps = ctx.cp - 1
    fwd_step, bwd_step = attention_s / 3 / ctx.cp, 2 * attention_s / 3 / ctx.cp
    fwd = steps * (ASSUMED.cp_step_overhead_s + max(0.0, kv / bw - fwd_step))
    bwd = steps * (ASSUMED.cp_step_overhead_s + max(0.0, 2 * kv / bw - bwd_step))
    k = fit.scale("comm_scale", "CP")
    return fwd * k, bwd * k


def p2p_bytes(ctx: Context) -> float:
    """One pipeline send (with sequence parallelism each TP rank sends its 1/TP shard)."""
    shard = ctx.tp if ctx.cfg.parallel.sequence_parallel else 1
    return ctx.tokens * ctx.model.hidden_size * act_bytes(ctx) / shard


def p2p_s(ctx: Context, rank: int, fit: Fitted) -> float:
    """One pipeline send from pipeline rank `rank` to the next (the last rank: to rank 0)."""
    if ctx.pp == 1:
        return 0.0
    link = p2p_link(ctx, rank)
    eff = fit.nvlink_bus_efficiency if link == NVLINK else 1.0
    lat = ctx.system.collective_latency_s or ASSUMED.p2p_latency_s
    t = lat + p2p_bytes(ctx) / bandwidth(ctx, link, eff)
    return t * fit.scale("comm_scale", "PP")


OPERAND_NVFP4 = 0.5625
"""Bytes per element of NVFP4 data: 4 bits plus an E4M3 scale per 16 elements."""


def param_gather_bytes_per_param(ctx: Context) -> float:
    perf = ctx.cfg.performance
    if perf.fp4_param_gather:
        return OPERAND_NVFP4
    if perf.fp8_param_gather:
        return 1.0
    return param_bytes(ctx)


def grad_bytes_per_param(ctx: Context) -> float:
    """Bytes of one gradient element reduced over DP: FP32 with `grad_reduce_in_fp32`, else the
    parameters' dtype (megatron-core 0.19.2 distributed/param_and_grad_buffer.py
    `group_params_for_buffers`: a buffer's gradient dtype is torch.float with
    `grad_reduce_in_fp32`, else the parameter's). Model revision 21: 2 bytes had been taken for
    FP32 parameters too."""
    return 4.0 if ctx.cfg.precision.grad_reduce_in_fp32 else param_bytes(ctx)


def dp_bucket_params(ctx: Context) -> float:
    """Megatron DDP's bucket size in parameters: the config's, else megatron-core 0.19.2's default
    (`DistributedDataParallel.__init__`: max(40M, 1M x the size of the DP group without CP, the
    `dp_group` of `ProcessGroupCollection.setup_process_groups_for_ddp`; model.builder resolves
    it the same way); infinite, one bucket a buffer, where the gradient reduce-scatter is not
    overlapped (the same `__init__` sets `bucket_size` to None without `overlap_grad_reduce`,
    whatever the config gave; model revision 20: the planner had laid the config's buckets)."""
    if not ctx.cfg.performance.overlap_grad_reduce:
        return math.inf
    return ctx.cfg.performance.ddp_bucket_size or max(40e6, 1e6 * ctx.dp)


def dp_bucket_sizes(sizes: Sequence[float], bucket: float) -> tuple[float, ...]:
    """The buckets megatron-core 0.19.2 lays a chunk's parameters into, in parameters, first
    bucket first: `sizes` in registration order are taken in reverse (the order the backward
    produces their gradients), a parameter is never split, and a bucket closes as soon as it
    holds `bucket` or more (`DistributedOptimizer._compute_per_buffer_param_layout`, as
    `_compute_default_per_buffer_param_layout` in distributed/param_and_grad_buffer.py; the
    64-element alignment of each parameter's start is left out). The first bucket's gradients
    are reduced first and its parameters used last in the forward."""
    out: list[float] = []
    acc = 0.0
    for n in reversed(sizes):
        acc += n
        if acc >= bucket:
            out.append(acc)
            acc = 0.0
    if acc > 0 or not out:
        out.append(acc)
    return tuple(out)


def dp_peers_share_a_core(ctx: Context, k: float) -> bool:
    """Members of one DP x CP group are pinned to one core: the ranks pinned k to a core
    (systems `pin_ranks`) in blocks of a pipeline stage's ranks in rank order (parallel/cores.py
    `core_for`), TP the fastest-varying dimension, so a block of more than TP ranks holds DP or
    CP peers (DP4 and PP2 x DP2 on the 2-core machine; not TP2 x DP2, whose blocks are TP
    pairs). Part of a group may be elsewhere (DP4: two peers on each core)."""
    return bool(ctx.system.pin_ranks) and k > 1 and ctx.dp * ctx.cp > 1 and k > ctx.tp


def dp_waits_s(ctx: Context, fit: Fitted, buckets: int) -> tuple[float, float]:
    """The fixed times a chunk's DP collectives take beyond their latency and bytes, (its
    reduce-scatter's, its all-gather's), per bucket of megatron-core's layout: where ranks share
    cores (core_share > 1, resolved per layout), `Fitted.shared_core_dp_s` (model revision 15,
    per bucket since 16); where the collective is overlapped, dispatched while its rank computes
    (megatron-core 0.19.2's `overlap_grad_reduce` for the reduce-scatters, launched by the
    backward's gradient hooks; `overlap_param_gather` for the all-gathers, by the forward's
    pre-hooks), `Fitted.overlap_dp_s` (model revision 19), and where the group's peers share a
    core (`dp_peers_share_a_core`) `Fitted.overlap_peer_core_dp_s` per step of the ring, group
    size less one (model revision 21: a transfer between two ranks that compute on one core
    waits for each of them to get its turn; bench/gloo_dp_groups.py --busy timed overlapped
    collectives at 1.65x their quiet time for TP2 x DP2, 3.8x for PP2 x DP2's one ring step on
    one core and 5.3x for DP4's three). Waits for a turn on a core or for a wake-up, not a
    core's work: they do not slow the compute they overlap (`dp_work_share`)."""
    shared = (fit.shared_core_dp_s or 0.0) if fit.core_share > 1 else 0.0
    peers = dp_peers_share_a_core(ctx, fit.core_share)
    peer = (fit.overlap_peer_core_dp_s or 0.0) if peers else 0.0
    over = (fit.overlap_dp_s or 0.0) + (ctx.dp * ctx.cp - 1) * peer
    perf = ctx.cfg.performance
    return (buckets * (shared + (over if perf.overlap_grad_reduce else 0.0)),
            buckets * (shared + (over if perf.overlap_param_gather else 0.0)))


def dp_work_share(ctx: Context, fit: Fitted, chunks: Sequence) -> float:
    """The share of a rank's DP collective time that is transfer (latency and bytes), the part
    that takes cores or SMs from the compute it overlaps (`dp_sm_share`, `dp_hbm_share`): its
    chunks' collectives that run beside its compute (the reduce-scatters, and the all-gathers
    where `overlap_param_gather` puts them there: without it they run after the optimizer,
    costs.plan's end-of-step work) less their waits (`dp_waits_s`); 1 without DP. Model
    revision 21: the all-gathers had been counted wherever they ran."""
    beside = ctx.cfg.performance.overlap_param_gather
    total = sum(c.reduce_s + (c.gather_s if beside else 0.0) for c in chunks)
    if total <= 0:
        return 1.0
    k = 1 if ctx.cfg.optimizer.distributed else 2   # dp_reduce_s: an all-reduce is twice
    waits = sum(k * r + (g if beside and c.gather_s > 0 else 0.0)
                for c in chunks for r, g in (dp_waits_s(ctx, fit, c.buckets),))
    return max(0.0, 1.0 - waits / total)


def dp_reduce_s(ctx: Context, params: float, fit: Fitted, buckets: int = 1) -> float:
    """Gradient reduce-scatter of `params` parameters over the DP x CP group (an all-reduce,
    twice the traffic, without the distributed optimizer), seconds."""
    if ctx.dp * ctx.cp == 1 or params <= 0:
        return 0.0
    sp = dp_cp_span(ctx)
    t = collective_s(ctx, params * grad_bytes_per_param(ctx), sp, fit.nvlink_bus_efficiency)
    # a profile's DP scale is of the collective; more buckets add the prior latency each, and
    # each bucket's waits (dp_waits_s)
    t = (t * fit.scale("comm_scale", "DP") + (buckets - 1) * latency(group_link(sp), ctx)
         + dp_waits_s(ctx, fit, buckets)[0])
    return t if ctx.cfg.optimizer.distributed else 2 * t


def dp_gather_s(ctx: Context, params: float, fit: Fitted, buckets: int = 1,
                high_params: float = 0.0) -> float:
    """Parameter all-gather of `params` parameters over DP x CP (distributed optimizer only);
    `high_params` of them are gathered in the parameters' dtype whatever the low-precision
    gather (the embedding and the output layer: costs.chunk_cost), as every parameter is without
    one (`param_bytes`)."""
    if ctx.dp * ctx.cp == 1 or params <= 0 or not ctx.cfg.optimizer.distributed:
        return 0.0
    sp = dp_cp_span(ctx)
    nbytes = (params - high_params) * param_gather_bytes_per_param(ctx) + high_params * param_bytes(ctx)
    t = collective_s(ctx, nbytes, sp, fit.nvlink_bus_efficiency)
    return (t * fit.scale("comm_scale", "DP") + (buckets - 1) * latency(group_link(sp), ctx)
            + dp_waits_s(ctx, fit, buckets)[1])


def dp_hbm_share(ctx: Context) -> float:
    """Share of HBM bandwidth a running DP collective takes from memory-bound kernels."""
    sp = dp_cp_span(ctx)
    if ctx.dp * ctx.cp == 1:
        return 0.0
    wire = bandwidth(ctx, group_link(sp), 1.0)
    return min(0.5, ASSUMED.nccl_hbm_bytes_per_wire_byte * wire / (ctx.system.hbm_tbs * 1e12))


def dp_sm_share(ctx: Context) -> float:
    """Share of the SMs (cores) a running DP collective takes from compute-bound kernels: NCCL's
    CTAs, or the system's `comm_units` (a CPU: gloo's worker thread on one core)."""
    if ctx.dp * ctx.cp == 1:
        return 0.0
    return min(0.5, (ctx.system.comm_units or ASSUMED.nccl_dp_ctas) / ctx.system.sm_count)


def dp_nvlink_share(ctx: Context, fit: Fitted) -> float:
    """Share of NVLink bandwidth a running DP reduce-scatter takes: its in-rack phase's bytes
    over the collective's duration, against the raw NVLink bandwidth."""
    sp = dp_cp_span(ctx)
    if ctx.dp * ctx.cp == 1 or sp.inside == 1:
        return 0.0
    nbytes = 1e9  # any size: the share is a ratio
    dur = collective_s(ctx, nbytes, sp, fit.nvlink_bus_efficiency)
    on_nvlink = nbytes * (sp.inside - 1) / sp.inside
    return min(0.5, on_nvlink / dur / (ctx.system.nvlink_gbs * 1e9))
