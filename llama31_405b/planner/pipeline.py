"""The interleaved 1F1B pipeline: bubble and microbatches in flight (FACTS.md section 6)."""
from __future__ import annotations

from .context import Context


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


def p2p_messages(ctx: Context) -> int:
    """Pipeline sends per rank per step: one activation forward and one gradient backward per
    microbatch and model chunk."""
    return 0 if ctx.pp == 1 else 2 * ctx.vp * ctx.microbatches
