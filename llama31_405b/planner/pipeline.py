"""The pipeline schedule Megatron runs: the order of forward and backward passes on each pipeline
rank (megatron-core 0.19.2, `pipeline_parallel.schedules`: `get_schedule_table`,
`get_pp_rank_microbatches` and the loops of `forward_backward_pipelining_with_interleaving` and
`..._without_interleaving`), the closed-form bubble, and the activations in flight.
"""
from __future__ import annotations

from functools import cache

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
