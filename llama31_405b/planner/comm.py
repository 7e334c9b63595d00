"""Communication time per step on one GPU: TP (sequence parallel), CP, PP and DP.

Volumes follow FACTS.md section 6. TP: per layer and microbatch 2 all-gathers + 2 reduce-scatters
forward and about 6 backward (mirrors + input re-gathers for the weight gradients), each moving
(t-1)/t of the activation b*(s/c)*h*2 bytes; all on the critical path unless TE's TP overlap is
on. CP: a ring over CP ranks exchanging K and V (forward) and K, V plus their gradients
(backward), hidden behind the attention kernel except a per-step overhead. PP: one send per
microbatch and model chunk in each direction. DP: the distributed optimizer's gradient
reduce-scatter and parameter all-gather over the DP x CP ranks, hierarchical (NVLink inside a
rack, then scale-out on 1/(ranks in the rack) of the data).
"""
from __future__ import annotations

from .calibration import ASSUMED, Fitted
from .context import Context, Stage
from .pipeline import p2p_messages

ACT_BYTES = 2.0  # BF16 activations on the wire


def nvlink_bytes_per_s(ctx: Context) -> float:
    return ctx.system.nvlink_gbs * 1e9


def tp_collectives_per_layer(ctx: Context) -> int:
    """Collectives per layer and microbatch (forward + backward); all-reduces count as two."""
    if ctx.tp == 1:
        return 0
    return 10 if ctx.cfg.parallel.sequence_parallel else 8


def tp_bytes(ctx: Context) -> float:
    """Bytes each GPU moves in one TP collective."""
    return (ctx.tp - 1) / ctx.tp * ctx.tokens * ctx.model.hidden_size * ACT_BYTES


def tp_terms(ctx: Context, st: Stage) -> tuple[float, float]:
    """(bandwidth seconds at full NVLink speed, latency seconds) of one microbatch on rank `st`.
    The output layer adds its gather and reduce-scatter on the last rank."""
    n = tp_collectives_per_layer(ctx) * st.layers + (2 if st.logits and ctx.tp > 1 else 0)
    return n * tp_bytes(ctx) / nvlink_bytes_per_s(ctx), n * ASSUMED.nvlink_latency_s


def tp_time(ctx: Context, st: Stage, fit: Fitted) -> float:
    """Exposed TP communication of one microbatch on rank `st`, seconds."""
    bw, lat = tp_terms(ctx, st)
    t = bw / fit.tp_bus_efficiency + lat
    return t * (1 - ASSUMED.tp_overlap_hidden) if ctx.cfg.performance.tp_comm_overlap else t


def cp_time(ctx: Context, st: Stage, attention_per_layer_s: float, fit: Fitted) -> float:
    """Exposed CP communication of one microbatch on rank `st` (forward + backward), seconds."""
    if ctx.cp == 1:
        return 0.0
    m = ctx.model
    kv_heads = max(m.num_query_groups // ctx.tp, 1)
    kv = ctx.tokens * 2 * kv_heads * m.kv_channels * ACT_BYTES
    bw = nvlink_bytes_per_s(ctx) * fit.tp_bus_efficiency
    steps = ctx.cp - 1
    fwd_step = attention_per_layer_s / 3 / ctx.cp
    bwd_step = 2 * attention_per_layer_s / 3 / ctx.cp
    per_layer = steps * (2 * ASSUMED.cp_step_overhead_s + max(0.0, kv / bw - fwd_step)
                         + max(0.0, 2 * kv / bw - bwd_step))
    return st.layers * per_layer


def pp_time(ctx: Context) -> float:
    """Pipeline sends per step on one GPU (with sequence parallelism each TP rank sends its
    1/TP shard), seconds."""
    n = p2p_messages(ctx)
    if not n:
        return 0.0
    shard = ctx.tp if ctx.cfg.parallel.sequence_parallel else 1
    size = ctx.tokens * ctx.model.hidden_size * ACT_BYTES / shard
    return n * (ASSUMED.p2p_latency_s + size / nvlink_bytes_per_s(ctx))


def _hierarchical(ctx: Context, nbytes: float) -> float:
    """Reduce-scatter or all-gather of `nbytes` per GPU over the DP x CP group."""
    inside = ctx.cp * min(ctx.replicas_per_rack, ctx.dp)
    across = ctx.dp // min(ctx.replicas_per_rack, ctx.dp)
    t = 0.0
    if inside > 1:
        t += nbytes * (inside - 1) / inside / nvlink_bytes_per_s(ctx) + ASSUMED.nvlink_latency_s
    if across > 1:
        t += (nbytes / inside * (across - 1) / across
              / (ctx.system.scaleout_gbs * 1e9 * ASSUMED.scaleout_bus_efficiency)
              + ASSUMED.scaleout_latency_s)
    return t


def param_gather_bytes_per_param(ctx: Context) -> float:
    perf = ctx.cfg.performance
    if perf.fp4_param_gather:
        return 0.5625
    if perf.fp8_param_gather:
        return 1.0
    return 2.0


def dp_time(ctx: Context) -> float:
    """Gradient reduce-scatter + parameter all-gather per step (all-reduce without the
    distributed optimizer), seconds, before any overlap."""
    params = ctx.params_per_gpu
    grad = 4.0 if ctx.cfg.precision.grad_reduce_in_fp32 else 2.0
    if ctx.dp * ctx.cp == 1:
        return 0.0
    if ctx.cfg.optimizer.distributed:
        return (_hierarchical(ctx, params * grad)
                + _hierarchical(ctx, params * param_gather_bytes_per_param(ctx)))
    return 2 * _hierarchical(ctx, params * grad)


def dp_exposed(ctx: Context, dp_s: float, window_s: float, fit: Fitted) -> float:
    """DP time left on the critical path: the fitted tail, or what does not fit the window of
    compute it overlaps with."""
    perf = ctx.cfg.performance
    if not (perf.overlap_grad_reduce and (perf.overlap_param_gather or not ctx.cfg.optimizer.distributed)):
        return dp_s
    return max(fit.dp_exposed_tail * dp_s, dp_s - window_s)
