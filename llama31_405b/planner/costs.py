"""The costs the step simulation schedules, for one layout and one set of fitted constants.

Per pipeline rank and model chunk: the compute of one microbatch's forward and backward (by
part), the TP and CP communication on the compute stream, the contention factor while a DP
collective runs, the chunk's gradient reduce-scatter and parameter all-gather. Per rank: the
pipeline send to the next rank and the end-of-step work (scaling the gradient buffer, the small
all-reduces of `finalize_model_grads`). Per step: the optimizer, zeroing the gradient buffer and
the host's share. Everything here is a closed formula; the order and overlap are the
simulation's (simulate.py).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from . import comm, compute
from .calibrate.constants import ASSUMED, Fitted
from .compute import PartTimes
from .context import Context
from .pipeline import chunk_layers
from .topology import NVLINK, dp_cp_span, group_link, latency


@dataclass(frozen=True, slots=True)
class ChunkCost:
    """One microbatch through one model chunk on one GPU (seconds, without contention)."""
    fwd: PartTimes
    bwd: PartTimes
    tp_fwd: float
    tp_bwd: float
    cp_fwd: float
    cp_bwd: float
    params: float
    """Parameters of the chunk on this GPU."""
    reduce_s: float
    """Its gradient reduce-scatter (all-reduce without the distributed optimizer)."""
    gather_s: float
    """Its parameter all-gather (distributed optimizer)."""
    buckets: int
    """DDP buckets: Megatron buckets only the first chunk of pipeline rank 0."""
    first_bucket_share: float
    """The first bucket's share of the chunk's parameters (comm.dp_bucket_sizes): the first
    gradients the backward makes ready, the last parameters the forward uses; 1 unbucketed."""
    last_bucket_share: float
    """The last bucket's: the first parameters the forward uses (the embedding's, on the first
    chunk), the last gradients the backward makes ready; 1 unbucketed."""
    first_fwd_s: float
    """Extra work of the chunk's first forward in a step: the transformer layers' weight casts
    (`weight_cast_bytes_per_param`; with NVFP4 parameters gathered only the transposed copy,
    TE's `_create_columnwise`); the embedding and the output layer cast nothing."""
    work_fwd: float
    """Forward compute + TP + CP + host."""
    work_bwd: float
    """Backward compute + TP + CP + host."""
    host_fwd: float = 0.0
    host_bwd: float = 0.0
    """Host time of the pass with nothing running (`host_pass_s` per layer)."""


@dataclass(frozen=True, slots=True)
class Plan:
    pp: int
    vp: int
    chunks: tuple[tuple[ChunkCost, ...], ...]
    """[pipeline rank][chunk]."""
    p2p: tuple[float, ...]
    """Send from rank r to the next (the last rank: to rank 0)."""
    sm_share: float
    """SMs a running DP collective takes (compute-bound kernels slow by 1/(1-share))."""
    hbm_share: float
    """HBM bandwidth a running DP collective takes (memory-bound kernels)."""
    nvlink_share: float
    """NVLink bandwidth a running DP collective takes (its in-rack phase): TP, CP and the pipeline
    sends slow down by it meanwhile."""
    overlap_grad: bool
    overlap_param: bool
    distributed: bool
    finalize_s: tuple[float, ...]
    """Per rank after its last backward and its DP traffic: scaling the gradient buffer by the
    token count and the small all-reduces of finalize_model_grads."""
    optimizer_s: float
    """After the all-rank synchronisation: gradient-norm all-reduce, Adam on the largest shard,
    the parameter all-gather when it is not overlapped."""
    zero_s: float
    """Zeroing the largest gradient buffer at the next step's start."""
    host_s: float
    busy_mb_s: float
    """Most work of one microbatch (all chunks, forward and backward) on any rank (times
    `stages_per_core`: the closed forms' bound where stages share a core)."""
    fwd_mb_s: float
    """Most forward work of one microbatch on any rank (times `stages_per_core`, as above)."""
    host_step_s: float = 0.0
    """The system's host time per step outside the passes (systems `host_s_per_step`, times the
    core share), with nothing running: a profile's host gaps, so the breakdown's host time."""
    param_gather_s: float = 0.0
    """The parameter all-gather in `optimizer_s` (distributed optimizer, not overlapped): DP
    time as a profile counts it (`step.Breakdown.dp_exposed_s`)."""
    blocking_p2p: bool = False
    """The pipeline's sends and receives block the rank between passes (megatron-core's
    schedules without overlap_p2p_comm: the builder's choice everywhere but interleaving on
    GPUs), each send until its receiver has posted the receive (gloo's sends do:
    bench/gloo_rendezvous.py; NCCL's plain 1F1B waits on every request and synchronises, its
    rendezvous for small messages unverified): simulate.py runs pipeline.rank_program's
    exchanges. False: sends in the background, a pass waits only for its own input (interleaved
    on GPUs, whose warm-up and cool-down exchanges block in megatron-core 0.19.2 all the same:
    not modelled)."""
    dp_work_share: tuple[float, ...] = ()
    """Per pipeline rank, the share of its DP collectives' time that is transfer and so takes
    cores, SMs or bandwidth from the compute it overlaps (comm.dp_work_share); (): all of it."""
    stages_per_core: int = 1
    """Pipeline stages whose ranks share one core (`stages_per_core`: pinned ranks, fewer cores
    than stages): consecutive stages in blocks of this many, each stage's passes slowed while
    another stage of its block runs (simulate.py); 1: none."""

    def inflation(self, parts: PartTimes, work: float, rank: int = 0) -> float:
        """Extra time per unit of work of pipeline rank `rank` while a DP collective runs:
        compute-bound parts lose the SMs NCCL occupies, memory-bound parts its share of HBM
        bandwidth, each for the share of the collectives' time that is transfer
        (`dp_work_share`; model revision 19: their waits took nothing)."""
        if work <= 0:
            return 0.0
        u = self.dp_work_share[rank] if self.dp_work_share else 1.0
        a, b, c = self.sm_share * u, self.hbm_share * u, self.nvlink_share * u
        bound = parts.total - parts.elementwise
        comm_s = work - parts.total  # with the host time: both wait on the same links/cores
        return (bound * a / (1 - a) + parts.elementwise * b / (1 - b) + comm_s * c / (1 - c)) / work


def stream_s(ctx: Context, nbytes: float) -> float:
    """A streaming kernel over `nbytes` of HBM traffic."""
    return nbytes / (ctx.system.hbm_tbs * 1e12 * ASSUMED.hbm_stream_efficiency)


def weight_cast_bytes_per_param(ctx: Context) -> float:
    """HBM traffic per parameter of the weight casts of a chunk's first forward in a step.
    Megatron marks the first microbatch (`is_first_microbatch`) and Transformer Engine keeps the
    quantized weights for the others, so the cast happens once per step: with the parameters
    gathered in NVFP4 (FP8) only the transposed copy is derived (read + write the low-precision
    data); with BF16 parameters gathered and a low-precision GEMM, each weight is read twice
    (its amax, then the cast) and written row- and column-wise in the GEMM's format."""
    perf, prec = ctx.cfg.performance, ctx.precision
    if prec not in ("nvfp4", "fp8"):
        return 0.0
    low = comm.OPERAND_NVFP4 if prec == "nvfp4" else 1.0
    if perf.fp4_param_gather or perf.fp8_param_gather:
        return 2 * low
    return 2 * 2.0 + 2 * low


def chunk_params(ctx: Context, layers: int, embedding: bool, logits: bool) -> float:
    h = ctx.model.hidden_size
    return ((layers * ctx.layer_params + (embedding + logits) * ctx.vocab * h) / ctx.tp
            + (h if logits else 0))


def chunk_param_sizes(ctx: Context, layers: int, embedding: bool,
                      logits: bool) -> list[float]:
    """The chunk's parameters on one GPU, one entry per tensor, in megatron-core 0.19.2's
    registration order (GPTModel: the embedding, the decoder's layers, its final norm, the output
    layer; a layer of the local spec: input_layernorm, self_attention.linear_proj, linear_qkv,
    pre_mlp_layernorm, mlp.linear_fc1, linear_fc2, the norms not split by TP). Transformer
    Engine's spec holds each norm inside the linear after it (linear_qkv.layer_norm_weight,
    linear_fc1.layer_norm_weight): the same tensors with the first norm after linear_proj, which
    moves a bucket boundary by at most the hidden size. Sums to `chunk_params` but for the norms,
    which that counts split by TP."""
    m, t = ctx.model, ctx.tp
    h, q, kv = m.hidden_size, m.num_attention_heads * m.kv_channels, m.num_query_groups * m.kv_channels
    layer = [h, q * h / t, (q + 2 * kv) * h / t, h, 2 * m.ffn_hidden_size * h / t,
             m.ffn_hidden_size * h / t]
    return ([ctx.vocab * h / t] if embedding else []) + layer * layers + (
        [h, ctx.vocab * h / t] if logits else [])


def tp_peers_share_a_core(ctx: Context, k: float) -> bool:
    """The ranks pinned to one core (systems `pin_ranks`, k of them) are TP peers: a pipeline
    stage's ranks in blocks of k (parallel/cores.py), TP the fastest-varying dimension. Each
    TP collective then waits for its core-mate's turn on the core: its time is k x its time
    with a core each (TP2 x DP2 pinned on the 2-core machine: 1.8x TP2's)."""
    return ctx.system.pin_ranks and k > 1 and ctx.tp >= k


def stages_per_core(ctx: Context, k: float) -> int:
    """Pipeline stages sharing each core: where the ranks are pinned k to a core in blocks of a
    pipeline stage's ranks (systems `pin_ranks`, parallel/cores.py `core_for`) and a block holds
    several whole stages (k a multiple of a stage's TP x CP x DP ranks, more than one of them:
    PP4 on the 2-core machine, stages 0 and 1 on one core). Consecutive stages of one pipeline
    are not in step: each runs at full speed while its core-mate waits for its input, at a share
    of the core while both run (simulate.py). 1 elsewhere."""
    stage = ctx.tp * ctx.cp * ctx.dp
    if not ctx.system.pin_ranks or k <= stage or k % stage:
        return 1
    return int(k // stage)


def stage_core_share(ctx: Context, k: float) -> float:
    """The ranks of one pipeline stage on each core, of the k ranks per core: what stretches a
    stage's passes throughout (its peers run in step); the other stages on its core
    (`stages_per_core`) slow it only while they run (simulate.py). k where a core holds one
    stage or part of one."""
    return k / stages_per_core(ctx, k)


def dp_peers_on_one_core(ctx: Context, k: float) -> bool:
    """Every DP group's ranks run on one core: the ranks pinned k to a core (systems
    `pin_ranks`) in blocks of a pipeline stage's ranks (parallel/cores.py `core_for`: stage order),
    each block a whole number of stages (k a multiple of a stage's TP x CP x DP ranks: PP2 x DP2
    on the 2-core machine). They take turns on it and reach the gradient collectives together;
    anywhere else (ranks on cores or GPUs of their own, a stage spread over cores) a group's
    replicas run at their own device's speed and wait for the slowest (`Fitted.dp_peer_wait`)."""
    stage = ctx.tp * ctx.cp * ctx.dp
    return ctx.system.pin_ranks and k > 1 and k % stage == 0


def dp_replicas_wait(ctx: Context, k: float) -> bool:
    """The DP replicas wait for the slowest of them at the gradient collectives (the model's
    `Fitted.dp_peer_wait`): a layout with DP (or CP) whose groups do not share one core
    (`dp_peers_on_one_core`)."""
    return ctx.dp * ctx.cp > 1 and not dp_peers_on_one_core(ctx, k)


def shared_compute_share(fit: Fitted) -> float:
    """Where a core's ranks are TP peers (`tp_peers_share_a_core`): the share of the core
    sharing's stretch (k - 1) their ops take (compute stretches by 1 + share x (k - 1)); fitted,
    else 1. Below 1, the two ranks handing the core to each other at every TP collective keep it
    busier than ranks that share it at the scheduler's slices: TP2 x DP2 pinned on the 2-core
    machine took 1.5x TP2's compute, its TP and host time 1.8-2.3x, its step 2.0x."""
    f = fit.shared_compute_share
    return 1.0 if f is None else f


def host_pass_s(ctx: Context, fit: Fitted) -> float:
    """Host time per layer and microbatch pass: its fixed part fitted from a profile (else the
    system's prior), plus the system's growth with the rank's tokens of the microbatch."""
    h = fit.host_s_per_layer_pass
    fixed = ctx.system.host_s_per_layer_pass if h is None else h
    return fixed + ctx.system.host_s_per_layer_token * ctx.tokens


def chunk_host_s(ctx: Context, fit: Fitted) -> float:
    """Host time per model chunk and microbatch pass beyond its layer slots' (the pipeline
    schedule's Python around the pass and its exchanges): fitted from a pipeline layout's
    profile, else the system's prior (model revision 22)."""
    c = fit.host_s_per_chunk_pass
    return ctx.system.host_s_per_chunk_pass if c is None else c


def chunk_slots(ctx: Context, rank: int, chunk: int) -> tuple[int, bool, bool]:
    """(transformer layers, holds the embedding, holds the output layer and loss) of a pipeline
    rank's model chunk."""
    layers = chunk_layers(ctx, rank, chunk) if ctx.pp > 1 else ctx.model.num_layers
    return layers, rank == 0 and chunk == 0, rank == ctx.pp - 1 and chunk == ctx.vp - 1


def emulated_linear_host_s(ctx: Context, layers: int) -> float:
    """Host time the emulated low-precision linears of `layers` transformer layers add to one
    pass beyond FP32 linears' (systems `host_s_per_emulated_linear`, 4 linears a layer: QKV,
    output projection, FFN up and down): 0 where the GEMMs are not emulated."""
    per_call = ctx.system.host_s_per_emulated_linear
    return 4 * layers * per_call if compute.emulated_gemms(ctx) else 0.0


def host_stretch(fit: Fitted, k: float) -> float:
    """How much longer host time takes where `k` ranks share a core: their turns (k), and
    `Fitted.shared_host_extra` of a rank's host time more for each core-mate (model revision
    18); k where no calibration fitted it (and on GPUs, where k is 1)."""
    return k + (fit.shared_host_extra or 0.0) * (k - 1)


def chunk_cost(ctx: Context, rank: int, chunk: int, fit: Fitted) -> ChunkCost:
    layers, emb, logits = chunk_slots(ctx, rank, chunk)
    fwd, bwd = compute.chunk_parts(ctx, layers, emb, logits, fit)
    # ranks sharing cores (systems `shared_cores`; 1 on GPUs): a stage's own ranks in step; the
    # other stages on its core slow it only while they run (simulate.py)
    k = stage_core_share(ctx, fit.core_share)
    tp_mates = tp_peers_share_a_core(ctx, k)
    kc = 1 + shared_compute_share(fit) * (k - 1) if tp_mates else k
    fwd, bwd = (fwd, bwd) if kc == 1 else (fwd.scaled(kc), bwd.scaled(kc))
    one = comm.tp_collective_s(ctx, fit) * (k if tp_mates else 1)
    nf, nb = comm.tp_counts(ctx, layers, emb, logits)
    cf, cb = comm.cp_layer_s(ctx, compute.attention_time(ctx, fit), fit)
    tp_f, tp_b, cp_f, cp_b = nf * one, nb * one, layers * cf, layers * cb
    if ctx.cfg.performance.recompute == "full":  # the backward reruns the forward first
        bwd = PartTimes(**{f.name: getattr(bwd, f.name) + getattr(fwd, f.name) for f in fields(bwd)})
        tp_b, cp_b = tp_b + tp_f, cp_b + cp_f
    params = chunk_params(ctx, layers, emb, logits)
    # only the transformer layers' weights are quantized, cast and gathered in low precision:
    # the embedding and the output layer stay BF16 (megatron-core 0.19.2: the recipe's context is
    # entered per transformer layer, TransformerBlock.forward for the casts and
    # TransformerBlock._build_layers with is_init for low-precision parameters; the embedding is
    # built outside it and GPTModel's output layer is tensor_parallel.ColumnParallelLinear)
    quantized = chunk_params(ctx, layers, False, False)
    first = stream_s(ctx, quantized * weight_cast_bytes_per_param(ctx))
    sizes: tuple[float, ...] = (1.0,)
    if rank == 0 and chunk == 0:    # DDP leaves later chunks and pipeline ranks unbucketed
        sizes = comm.dp_bucket_sizes(chunk_param_sizes(ctx, layers, emb, logits),
                                     comm.dp_bucket_params(ctx))
    buckets, total = len(sizes), sum(sizes)
    # embedding and loss as layers, the emulated linears' Python (model revision 18) and the
    # schedule's around the chunk's pass (revision 22)
    host = (host_pass_s(ctx, fit) * (layers + emb + logits) + chunk_host_s(ctx, fit)
            + emulated_linear_host_s(ctx, layers)) * host_stretch(fit, k)
    host_b = host * (2 if ctx.cfg.performance.recompute == "full" else 1)
    return ChunkCost(fwd=fwd, bwd=bwd, tp_fwd=tp_f, tp_bwd=tp_b, cp_fwd=cp_f, cp_bwd=cp_b,
                     params=params, reduce_s=comm.dp_reduce_s(ctx, params, fit, buckets),
                     gather_s=comm.dp_gather_s(ctx, params, fit, buckets,
                                               high_params=params - quantized), buckets=buckets,
                     first_bucket_share=sizes[0] / total, last_bucket_share=sizes[-1] / total,
                     first_fwd_s=first, work_fwd=fwd.total + tp_f + cp_f + host,
                     work_bwd=bwd.total + tp_b + cp_b + host_b, host_fwd=host, host_bwd=host_b)


_PLANS: dict[tuple, Plan] = {}


def plan(ctx: Context, fit: Fitted) -> Plan:
    """The costs of a layout (cached: they do not depend on the number of microbatches)."""
    key = (ctx.key, fit)
    if key not in _PLANS:
        if len(_PLANS) > 5000:
            _PLANS.clear()
        _PLANS[key] = _plan(ctx, fit)
    return _PLANS[key]


def _plan(ctx: Context, fit: Fitted) -> Plan:
    if fit.collective_latency_s is not None:  # a calibration's transport latency (calibrate/solver.py)
        ctx = replace(ctx, system=replace(ctx.system, collective_latency_s=fit.collective_latency_s))
    pp, vp = ctx.pp, ctx.vp
    made: dict[tuple, ChunkCost] = {}

    def cost(r: int, c: int) -> ChunkCost:
        layers = chunk_layers(ctx, r, c) if pp > 1 else ctx.model.num_layers
        key = (layers, r == 0 and c == 0, r == pp - 1 and c == vp - 1)
        if key not in made:
            made[key] = chunk_cost(ctx, r, c, fit)
        return made[key]

    chunks = tuple(tuple(cost(r, c) for c in range(vp)) for r in range(pp))
    perf, dist = ctx.cfg.performance, ctx.cfg.optimizer.distributed
    grad_b = comm.grad_bytes_per_param(ctx)
    dp_link = group_link(dp_cp_span(ctx))
    world_link = NVLINK if ctx.racks == 1 else dp_link
    finalize = []
    for r in range(pp):
        params = sum(c.params for c in chunks[r])
        t = stream_s(ctx, 2 * params * grad_b)  # grad_data *= 1/num_tokens, read + write
        t += latency(NVLINK, ctx) if ctx.tp > 1 and ctx.cfg.parallel.sequence_parallel else 0.0
        t += ASSUMED.p2p_latency_s if pp > 1 else 0.0  # num_tokens broadcast over PP
        t += latency(dp_link, ctx) if ctx.dp * ctx.cp > 1 else 0.0  # and all-reduce over DP x CP
        finalize.append(t)
    most = max(sum(c.params for c in row) for row in chunks)
    shard = most / (ctx.dp * ctx.cp) if dist else most
    opt = 2 * latency(world_link, ctx) + stream_s(ctx, shard * ASSUMED.optimizer_bytes_per_param)
    gather = 0.0
    if dist and not perf.overlap_param_gather:
        gather = max(sum(c.gather_s for c in row) for row in chunks)
    opt += gather
    turns = stages_per_core(ctx, fit.core_share)
    return Plan(pp=pp, vp=vp, chunks=chunks, p2p=tuple(comm.p2p_s(ctx, r, fit) for r in range(pp)),
                sm_share=comm.dp_sm_share(ctx), hbm_share=comm.dp_hbm_share(ctx),
                nvlink_share=comm.dp_nvlink_share(ctx, fit),
                overlap_grad=perf.overlap_grad_reduce,
                overlap_param=perf.overlap_param_gather and dist, distributed=dist,
                finalize_s=tuple(finalize), optimizer_s=opt, zero_s=stream_s(ctx, most * grad_b),
                host_s=ASSUMED.host_step_overhead_s,
                # at the step's end every rank of a core runs its own: stretched by all of them
                host_step_s=ctx.system.host_s_per_step * host_stretch(fit, fit.core_share),
                # the closed forms' bound where stages share a core: every pass stretched by
                # their number (the simulation runs their turns)
                busy_mb_s=turns * max(sum(c.work_fwd + c.work_bwd for c in row) for row in chunks),
                fwd_mb_s=turns * max(sum(c.work_fwd for c in row) for row in chunks),
                param_gather_s=gather,
                dp_work_share=tuple(comm.dp_work_share(ctx, fit, row) for row in chunks),
                # model/builder.transformer_config: overlap_p2p_comm=gpu and vp > 1
                blocking_p2p=pp > 1 and not (ctx.system.is_gpu and vp > 1),
                stages_per_core=turns)
