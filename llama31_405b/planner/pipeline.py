"""The pipeline schedule Megatron runs: the order of forward and backward passes on each pipeline
rank (megatron-core 0.19.2, `pipeline_parallel.schedules`: `get_schedule_table`,
`get_pp_rank_microbatches` and the loops of `forward_backward_pipelining_with_interleaving` and
`..._without_interleaving`), the closed-form bubble, and the activations in flight.
"""
from __future__ import annotations

from functools import cache
from typing import NamedTuple

from .context import Context

Op = tuple[bool, int, int]
"""(forward?, microbatch, model chunk)."""


@cache
def schedule_table(m: int, vp: int, group: int) -> tuple[tuple[int, int], ...]:
    """(microbatch, chunk) of each virtual microbatch id: groups of `group` microbatches (the
    last group takes the remainder) run through every chunk before the next group starts."""
    out: list[tuple[int, int]] = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group
        out.extend((mb, c) for c in range(vp) for mb in range(lo, hi))
    return tuple(out)


def warmup_count(pp: int, vp: int, m: int, rank: int, group: int) -> int:
    """Forward passes before the first backward (Megatron's num_warmup_microbatches)."""
    total = m * vp
    if pp == 1:
        return 0
    if vp == 1:
        return min(m, pp - rank - 1)
    return min(total, (pp - rank - 1) * 2 + (vp - 1) * group)


@cache
def rank_order(pp: int, vp: int, m: int, rank: int, group: int | None = None) -> tuple[Op, ...]:
    """The passes pipeline rank `rank` runs in one step, in Megatron's order: warm-up forwards,
    then one forward and one backward per iteration (1F1B), then the cool-down backwards. The
    backward of virtual id k runs chunk VP-1-c of the table's (microbatch, c)."""
    group = group or pp
    table = schedule_table(m, vp, group)
    w = warmup_count(pp, vp, m, rank, group)
    fwd = [(True, mb, c) for mb, c in table]
    bwd = [(False, mb, vp - 1 - c) for mb, c in table]
    order: list[Op] = fwd[:w]
    for k in range(len(table) - w):
        order += [fwd[k + w], bwd[k]]
    order += bwd[len(table) - w:]
    return tuple(order)


class Exchange(NamedTuple):
    """One call of megatron-core's P2PCommunicator between passes (`send_forward_recv_forward`,
    `send_forward_backward_recv_forward_backward`, ...): the sends and receives it makes, all
    awaited before the rank goes on. `next`/`prev`: the pipeline neighbours (the last rank's next
    is rank 0: interleaving's wrap-around)."""
    send_next: bool = False
    """Activations to the next rank."""
    send_prev: bool = False
    """Gradients to the previous rank."""
    recv_prev: bool = False
    """Activations from the previous rank."""
    recv_next: bool = False
    """Gradients from the next rank."""


@cache
def rank_program(pp: int, vp: int, m: int, rank: int,
                 group: int | None = None) -> tuple[Op | Exchange, ...]:
    """The passes of `rank_order` with the blocking exchanges Megatron makes between them when
    the pipeline's communication is not overlapped (overlap_p2p_comm off, as on gloo; plain 1F1B
    always): megatron-core 0.19.2's `forward_backward_pipelining_with_interleaving` (its
    "No p2p overlap" branches, `recv_tensor_from_previous_stage`) and
    `forward_backward_pipelining_without_interleaving`. Empty exchanges are left out."""
    first, last = rank == 0, rank == pp - 1
    out: list[Op | Exchange] = []

    def x(**kw: bool) -> None:
        if any(kw.values()):
            out.append(Exchange(**kw))

    order = rank_order(pp, vp, m, rank, group)   # PP 1: the passes alone (no exchange)
    if vp == 1:
        w = min(m, pp - rank - 1)
        for i in range(w):
            x(recv_prev=not first)
            out.append(order[i])
            x(send_next=not last)
        if w < m:
            x(recv_prev=not first)
        for i in range(m - w):
            out.append(order[w + 2 * i])
            x(send_next=not last, recv_next=not last)
            out.append(order[w + 2 * i + 1])
            x(send_prev=not first, recv_prev=not first and i < m - w - 1)
        for i in range(w):
            x(recv_next=not last)
            out.append(order[2 * m - w + i])
            x(send_prev=not first)
        return tuple(out)
    group = group or pp
    table, total = schedule_table(m, vp, group), m * vp
    w = warmup_count(pp, vp, m, rank, group)
    all_warm = (pp - rank - 1) * 2 + (vp - 1) * group >= total

    def chunk(k: int, fwd: bool) -> int:
        c = table[k % total][1]
        return c if fwd else vp - 1 - c

    def recv(k: int, fwd: bool) -> bool:
        # recv_tensor_from_previous_stage: the leading stage (first rank forward, last rank
        # backward) is PP-1 virtual microbatches ahead of the one that feeds it
        if not (first if fwd else last):
            return True
        aligned = chunk(k + 1, fwd) if k < pp - 1 else chunk(k - (pp - 1), fwd)
        return k >= pp - 1 and aligned != (vp - 1 if fwd else 0)

    def sends(k: int, fwd: bool) -> bool:
        return not (last and chunk(k, True) == vp - 1) if fwd else not (first and chunk(k, False) == 0)

    fwds = [op for op in order if op[0]]
    bwds = [op for op in order if not op[0]]
    x(recv_prev=not first)
    for k in range(w):
        out.append(fwds[k])
        rp = recv(k, True) and k != total - 1
        if k == w - 1 and not all_warm:
            x(send_next=sends(k, True), recv_prev=rp, recv_next=not last)
        else:
            x(send_next=sends(k, True), recv_prev=rp)
    for k in range(total - w):
        out += [fwds[k + w], bwds[k]]
        x(send_next=sends(k + w, True), send_prev=sends(k, False),
          recv_prev=recv(k + w, True) and k != total - w - 1, recv_next=recv(k, False))
    if all_warm:
        x(recv_next=not last)
    for k in range(total - w, total):
        out.append(bwds[k])
        x(send_prev=sends(k, False), recv_next=recv(k, False) and k != total - 1)
    return tuple(out)


def bubble_fraction(ctx: Context) -> float:
    """Idle share relative to the busy time: (PP-1)/(VP*m) interleaved, (PP-1)/m plain 1F1B."""
    if ctx.pp == 1:
        return 0.0
    return (ctx.pp - 1) / (ctx.vp * ctx.microbatches)


def warmup_forwards(ctx: Context, rank: int) -> int:
    """Forwards pipeline rank `rank` runs before its first backward, plus the one in flight in
    steady state (Megatron's interleaved schedule; plain 1F1B: PP - rank)."""
    m, pp, vp = ctx.microbatches, ctx.pp, ctx.vp
    if pp == 1:
        return 1
    if vp == 1:
        return min(m, pp - rank)
    return min(m * vp, (pp - rank - 1) * 2 + (vp - 1) * pp + 1)


def chunk_layers(ctx: Context, rank: int, chunk: int) -> int:
    """Transformer layers of model chunk `chunk` on pipeline rank `rank`: virtual stage
    chunk*PP + rank holds slots/(PP*VP) slots, the first one embedding slot fewer layers and the
    last one loss slot fewer."""
    perf = ctx.cfg.performance
    emb, loss = perf.account_for_embedding_in_pipeline_split, perf.account_for_loss_in_pipeline_split
    slots = ctx.model.num_layers + emb + loss
    per = slots // (ctx.pp * ctx.vp)
    stage = chunk * ctx.pp + rank
    return per - (emb if stage == 0 else 0) - (loss if stage == ctx.pp * ctx.vp - 1 else 0)


_PEAK: dict[tuple, int] = {}


def peak_layer_microbatches(ctx: Context) -> int:
    """Most (layer, microbatch) activation sets any pipeline rank holds at once: the layers of
    the chunks of its warm-up forwards, which visit chunks in groups of PP microbatches."""
    key = (ctx.key, min(ctx.microbatches, 2 * ctx.pp + ctx.pp * ctx.vp))
    if key not in _PEAK:
        if len(_PEAK) > 20000:
            _PEAK.clear()
        _PEAK[key] = _peak_layer_microbatches(ctx)
    return _PEAK[key]


def _peak_layer_microbatches(ctx: Context) -> int:
    if ctx.pp == 1:
        return ctx.model.num_layers
    best = 0
    for rank in range(ctx.pp):
        w, total, group = warmup_forwards(ctx, rank), 0, 0
        while group * ctx.pp < w:
            n = min(ctx.pp, w - group * ctx.pp)
            total += n * chunk_layers(ctx, rank, group % ctx.vp)
            group += 1
        best = max(best, total)
    return best
