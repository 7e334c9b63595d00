"""Which link each communication of a layout uses, from the system and the rank order.

Megatron orders ranks "tp-cp-ep-pp-dp" (TP fastest, DP outermost) and Slurm fills nodes in rank
order, so a rack (one NVLink domain, `gpus per rack` consecutive ranks) holds consecutive ranks.
A group of ranks with stride s and n members therefore has min(n, rack / s) members in each rack
it touches (1 when s >= rack): its collective runs on NVLink inside the rack and on the
scale-out network across racks. A pipeline send between ranks r*s and (r+1)*s crosses racks when
the two fall in different racks. On GB200 NVL72 the validator keeps a model-parallel group inside
one rack, so TP, CP and PP are NVLink and only DP crosses racks; on 8-GPU nodes a pipeline longer
than a node sends across the scale-out network, which these functions report as such.
"""
from __future__ import annotations

from dataclasses import dataclass

from .calibrate.constants import ASSUMED
from .context import Context

NVLINK, SCALEOUT = "nvlink", "scaleout"


@dataclass(frozen=True, slots=True)
class Span:
    """How a group of ranks lies on the racks: `inside` members per rack, `across` racks."""
    inside: int
    across: int


def rack_ranks(ctx: Context) -> int:
    return ctx.cfg.system.gpus_per_rack or ctx.system.gpus_used_per_rack


def span(ctx: Context, stride: int, size: int) -> Span:
    d = rack_ranks(ctx)
    inside = 1 if stride >= d else max(1, min(size, d // stride))
    return Span(inside=inside, across=max(1, size // inside))


def tp_span(ctx: Context) -> Span:
    return span(ctx, 1, ctx.tp)


def cp_span(ctx: Context) -> Span:
    return span(ctx, ctx.tp, ctx.cp)


def dp_cp_span(ctx: Context) -> Span:
    """The distributed optimizer's group: CP (stride TP) times DP (stride TP*CP*PP)."""
    cp, dp = cp_span(ctx), span(ctx, ctx.tp * ctx.cp * ctx.pp, ctx.dp)
    return Span(inside=cp.inside * dp.inside, across=cp.across * dp.across)


def p2p_link(ctx: Context, rank: int) -> str:
    """Link of the pipeline send from pipeline rank `rank` to the next one (the last rank sends
    to rank 0 when the interleaved schedule moves to the next model chunk)."""
    s, d = ctx.tp * ctx.cp, rack_ranks(ctx)
    nxt = (rank + 1) % ctx.pp
    return NVLINK if (rank * s) // d == (nxt * s) // d else SCALEOUT


def bandwidth(ctx: Context, link: str, nvlink_efficiency: float) -> float:
    """Achieved bytes per second per GPU and direction on a link."""
    if link == NVLINK:
        return ctx.system.nvlink_gbs * 1e9 * nvlink_efficiency
    return ctx.system.scaleout_gbs * 1e9 * ASSUMED.scaleout_bus_efficiency


def latency(link: str, ctx: Context | None = None) -> float:
    """Per-collective latency on a link: the system's `collective_latency_s` where it sets one
    (a CPU's gloo), else the assumed NVLink or scale-out latency."""
    if ctx is not None and ctx.system.collective_latency_s:
        return ctx.system.collective_latency_s
    return ASSUMED.nvlink_latency_s if link == NVLINK else ASSUMED.scaleout_latency_s


def group_link(sp: Span) -> str:
    """The slowest link a collective over this span uses."""
    return SCALEOUT if sp.across > 1 else NVLINK


def collective_s(ctx: Context, nbytes: float, sp: Span, nvlink_efficiency: float) -> float:
    """Reduce-scatter or all-gather of `nbytes` per GPU over a group with this span, done
    hierarchically as NCCL does across racks: the members inside a rack exchange on NVLink, and
    each rack's 1/inside share crosses the scale-out network (one NIC per GPU)."""
    t = 0.0
    if sp.inside > 1:
        t += (nbytes * (sp.inside - 1) / sp.inside / bandwidth(ctx, NVLINK, nvlink_efficiency)
              + latency(NVLINK, ctx))
    if sp.across > 1:
        t += (nbytes / sp.inside * (sp.across - 1) / sp.across / bandwidth(ctx, SCALEOUT, 1.0)
              + latency(SCALEOUT, ctx))
    return t
