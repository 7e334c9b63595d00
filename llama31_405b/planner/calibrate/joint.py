"""One set of constants fitted to several measured layouts at once (`plan --calibrate` given the
profile folders of two or more layouts; issue 46, point 3).

No single 2-rank layout on a CPU has both of gloo's collective sizes: TP2 has TP's many small
all-reduces (latency) and no DP, DP2 has DP's few large gradient collectives (bytes) and no TP.
The one transport's latency and bandwidth (`solver._link`) then come from two layouts: TP's
figure from the layout that has TP, DP's from the layout that has DP (its collectives' time less
the waiting for the slowest replica, `Summary.dp_transfer_s`; the waiting is its own constant,
`solver._peer_wait`). Every other constant is
fitted to each layout as `solver.solve` fits it, given the shared communication constants, and
the layouts' values are averaged: the compute constants (each layout's own measure of the same
kernels), the pipeline sends' scale, the host time per layer pass that closes each step. The
fit is over-determined, so the fitted layouts no longer reproduce their steps exactly: the
calibration file's [check] shows each one's simulated step next to its measured step.

Where the ranks share cores (systems `shared_cores`) and the layouts include some whose ranks
each have a core and some whose ranks do not (one layout profiled at 2 ranks and, with a second
replica, at 4: the same work per rank), the compute constants come from the layouts whose ranks
each have a core (the kernels without waiting), and what the sharing does beyond the ranks per
core (the ranks are pinned: step.core_share) to the transport from the others; the host time
per layer pass closes the steps of the layouts whose ranks each have a core, and what each
core-mate adds to a rank's host time the others' (model revision 18; the host time per pass had
closed the shared layouts' steps and carried TP2 x DP2's TP calls into every 4-rank layout);
where a 4-rank layout's core-mates are TP peers, the share of the stretch their ops
take (`Fitted.shared_compute_share`, `_compute_share`: its modelled compute made its measured
compute). Since model revision 15 the transport comes from both kinds of layout: its latency
from the TP of a layout whose ranks share cores (TP2 x DP2: the core-mates' turns are in every TP
call), its bandwidth from the DP of a layout whose ranks each have a core (DP2: the bytes' rate
per rank: 1.28 and 1.29 ms per MB at DP2 and DP4 when measured apart), and what a core's sharing adds to each
DP collective (`Fitted.shared_core_dp_s`) from the DP of a layout whose ranks share cores
(`_shared_link`). Model revisions 2-9 also solved the share of its communication time a rank keeps a
core busy (`Fitted.comm_core_fraction`) from the 4-rank layouts' compute; pinned ranks
(revision 10) leave nothing for it to describe.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from statistics import fmean
from typing import Any

from .. import compute
from ..comm import dp_peers_share_a_core
from ..context import Context
from ..costs import plan, stage_core_share, tp_peers_share_a_core
from ..step import breakdown, core_share, rank_compute
from .constants import Fitted
from .precisions import with_probe
from .solver import (LINEAR, _close_step, _comm, _compute, _initial, _link, _modelled, _peer_wait,
                     _pp_scale, _same, _secant, _slowdown, compared_rank, config_of, dp_figure,
                     fit_memory, solve)
from .summary import Summary


def mean(fits: list[Fitted]) -> Fitted:
    """The field-by-field mean of several fits: a number the mean of those that have one (None
    where none has), a table (name, value) the mean per name over the fits that have it."""
    out: dict[str, Any] = {}  # Fitted's fields, each of its own type
    for f in fields(Fitted):
        vals = [getattr(x, f.name) for x in fits]
        if isinstance(vals[0], tuple):
            keys = sorted({k for v in vals for k, _ in v})
            out[f.name] = tuple((k, fmean([dict(v)[k] for v in vals if k in dict(v)]))
                                for k in keys)
        else:
            nums = [v for v in vals if v is not None]
            out[f.name] = fmean(nums) if nums else None
    return replace(fits[0], **out)


def _shared_link(runs: list[tuple[Context, Summary]], fit: Fitted,
                 shared: Sequence[tuple[Context, Summary]] = ()) -> Fitted | None:
    """The one transport's latency and bandwidth from TP's figure of the first layout with TP
    (of `shared`, else of `runs`) and DP's of the first layout of `runs` with DP (the same layout
    where one has both); then, where `shared` (layouts whose ranks share cores) has one with DP,
    the fixed time a chunk's DP collective takes among ranks sharing cores
    (`Fitted.shared_core_dp_s`, model revision 15) for which the first such layout's modelled DP
    is its figure (linear in it; 0 where the transport alone reaches it). None on a system with
    several transports, or where no layout gives TP's figure or none of `runs` DP's."""
    if not runs[0][0].system.one_transport:
        return None
    tp = next(((ctx, dict(c.exposed)["TP"]) for ctx, c in [*shared, *runs]
               if ctx.tp > 1 and dict(c.exposed).get("TP")), None)
    dp = next(((ctx, x) for ctx, c in runs if ctx.dp * ctx.cp > 1
               for x in (dp_figure(ctx, c, fit),) if x), None)
    if tp is None or dp is None:
        return None
    link = _link(fit, tp, dp)
    first = [(ctx, c) for ctx, c in shared if ctx.dp * ctx.cp > 1 and dp_figure(ctx, c, fit)][:1]
    return None if link is None else _fixed_time_of(
        first, link, lambda f, v: replace(f, shared_core_dp_s=v))


def _solved(figure: Callable[[float], float], target: float) -> float | None:
    """The time x (seconds) at which a modelled figure linear in it, `figure(x)`, is `target`:
    the line through its values at 0 and 1 ms; at least 0 (where the figure reaches the target
    without it); None where it does not grow with x."""
    at = [figure(0.0), figure(1e-3)]
    return None if at[1] <= at[0] else max(0.0, (target - at[0]) / (at[1] - at[0]) * 1e-3)


def _dp_fixed_time(ctx: Context, with_time: Callable[[float], Fitted],
                   target: float) -> float | None:
    """The value of a DP collective's fixed time per bucket (`shared_core_dp_s`,
    `overlap_dp_s`: comm.dp_waits_s; `with_time(x)`: the constants with it at x) for which the
    layout's modelled DP collectives take `target` seconds (`_solved`); None where it adds
    nothing to the layout's DP."""
    return _solved(lambda x: _modelled(ctx, with_time(x), breakdown(ctx, with_time(x)), "DP"),
                   target)


def _with_pp(runs: list[tuple[Context, Summary]], fit: Fitted) -> Fitted:
    """The pipeline sends' scale (solved with the bubble they cause) of each fit layout with a
    pipeline, averaged; `fit` unchanged where none has one."""
    got = [_pp_scale(ctx, fit, dict(c.exposed)["PP"], fit.scale("comm_scale", "PP"))
           for ctx, c in runs if ctx.pp > 1 and dict(c.exposed).get("PP")]
    if not got:
        return fit
    table = dict(fit.comm_scale) | {"PP": fmean(got)}
    return replace(fit, comm_scale=tuple(sorted(table.items())))


def _by_call_part(per: dict[str, float]) -> dict[str, float]:
    out = {p: per[p] for p in compute.CALL_PARTS if p in per}
    out["ffn"] = per["ffn_up"] + per["ffn_down"]
    return out


def _part_figures(ctx: Context, c: Summary, fit: Fitted) -> tuple[dict, dict, dict]:
    """Per part of `compute.CALL_PARTS`, on the compared rank per step (`solver.compared_rank`:
    the busiest, or the inner rank a summary names): (the measured time, the
    modelled time without `call_s` at `fit`'s rates, the count `call_s` multiplies: layer
    sequences for the GEMMs and the attention, layer passes for the elementwise work). The
    measured parts as `solver._compute` reads them (less the contention of overlapped DP
    collectives; the elementwise part less the per-step weight transposes)."""
    b = breakdown(ctx, fit)
    fk = replace(fit, core_share=b.core_share, call_s=())
    rank = compared_rank(ctx, c, fk, b.rank)
    clean = c.compute_s - _slowdown(ctx, fit, b, rank)
    k = clean / c.compute_s
    base = _by_call_part(rank_compute(ctx, fk, rank))
    ones = _by_call_part(rank_compute(ctx, replace(fk, call_s=tuple(
        (p, 1.0) for p in compute.CALL_PARTS)), rank))
    fixed = sum(ch.first_fwd_s for ch in plan(ctx, fk).chunks[rank])
    calls = {p: ones[p] - base[p] for p in base}
    base["elementwise"] -= fixed
    parts = dict(c.parts)
    measured = {p: parts.get(p, 0.0) * k for p in (*LINEAR, "attention")}
    measured["ffn"] = c.ffn_share_of_compute * clean
    measured["elementwise"] = (1 - c.gemm_share_of_compute) * clean - fixed
    return measured, base, calls


def _call_times(own: list[tuple[Context, Summary]], fit: Fitted) -> Fitted | None:
    """The compute constants with a time that does not grow with the work (`Fitted.call_s`:
    per layer sequence for the GEMMs and the attention, per layer pass for the elementwise
    work), from two or more layouts whose ranks each have a core: per part, the least-squares
    (time per count, rate) for which count x time + work / rate is each layout's measured
    time. Only layouts whose passes differ in size for their work separate the two
    (TP2 against DP2: the same work per rank in twice the passes); a part where none do keeps
    no such time (its rate from all of them), and None where no part has them (the fit is then
    `solver._compute`'s mean). The elementwise work's time per pass and rate come from the
    layouts without TP where the fit has any (from DP2 at two microbatch sizes, say; from DP2
    alone its rate only), and the time a TP rank's pass adds to them from the layouts with TP
    (`compute.ELEMENTWISE_TP`, the least-squares time per pass of their residual; 0 where
    negative): contrasted with DP2 at one microbatch size, TP2's passes read as a time per pass
    of 2.25 ms and a rate of 0.82 of the committed 2-rank runs' median, where DP2 alone at
    microbatches of 1, 2 and 4 gives 0.88 ms and 1.70, TP2 alone 1.59 ms and 1.59 (model
    revision 14). A time per pass solved below 0 (or below a billionth of the
    measured part) is 0."""
    figs = [(_part_figures(ctx, c, fit), ctx.tp > 1) for ctx, c in own]
    scale: dict[str, float] = {}
    call: dict[str, float] = {}
    for p in compute.CALL_PARTS:
        # a TP rank's passes hold elementwise work the model does not count (model revision 14):
        # the elementwise part's time per pass and rate from the layouts without TP where the
        # fit has some, what TP adds per pass from the others (`compute.ELEMENTWISE_TP`)
        every = [((n[p], u[p], m[p]), tp and p == "elementwise") for (m, u, n), tp in figs
                 if u.get(p, 0.0) > 0 and m[p] > 0]
        plain = [r for r, on_tp in every if not on_tp]
        tp_rows = [r for r, on_tp in every if on_tp] if plain else []
        rows = plain or [r for r, _ in every]
        if not rows:
            continue
        nn, nu, uu = (sum(n * n for n, _, _ in rows), sum(n * u for n, u, _ in rows),
                      sum(u * u for _, u, _ in rows))
        nm, um = sum(n * m for n, _, m in rows), sum(u * m for _, u, m in rows)
        det = nn * uu - nu * nu
        c = (nm * uu - um * nu) / det if det > 1e-9 * nn * uu else 0.0
        if c * max(n for n, _, _ in rows) < 1e-9 * max(m for _, _, m in rows):
            c = 0.0  # rounding, not a time: the passes' size leaves the part unchanged
        s = (nn * um - nu * nm) / det if c > 0 else um / uu
        if s <= 0:
            c, s = 0.0, um / uu
        call[p], scale[p] = c, s
        extra = (sum(n * (m - n * c - u * s) for n, u, m in tp_rows)
                 / max(sum(n * n for n, _, _ in tp_rows), 1e-30))
        call |= {compute.ELEMENTWISE_TP: extra} if extra > 0 else {}
    if not any(call.values()) or "ffn" not in scale:
        return None
    prec = compute.gemm_precision(own[0][0])
    eta = compute.gemm_peak_fraction(prec, fit) / scale["ffn"]
    # the GEMM fraction moves the parts in the fitted precision only (compute.part_precision)
    ffn = {p: scale["ffn"] if compute.part_precision(own[0][0], p) == prec else 1.0 for p in LINEAR}
    parts = dict(fit.gemm_part_scale) | {p: fit.scale("gemm_part_scale", p) * scale[p]
                                         / ffn[p] for p in LINEAR if p in scale}
    new = replace(fit, call_s=tuple(sorted(call.items())),
                  gemm_part_scale=tuple(sorted(parts.items())),
                  attention_bf16_fraction=fit.attention_bf16_fraction / scale.get("attention", 1.0),
                  elementwise_passes=fit.elementwise_passes * scale.get("elementwise", 1.0))
    return (replace(new, nvfp4_gemm_peak_fraction=eta) if prec == "nvfp4"
            else replace(new, gemm_fraction=tuple(sorted((dict(fit.gemm_fraction)
                                                          | {prec: eta}).items()))))


def _shares_cores(ctx: Context) -> bool:
    """The layout has more ranks than the system's `shared_cores` (none on GPUs): some wait for
    a core."""
    cores = ctx.system.shared_cores
    return bool(cores) and ctx.tp * ctx.pp * ctx.cp * ctx.dp > cores


def _core_split(runs: list[tuple[Context, Summary]]) -> tuple[list, list]:
    """(the layouts whose ranks each have a core, those whose ranks share them) where the fit
    has both on a system with `shared_cores`; else (every layout, none)."""
    own = [r for r in runs if not _shares_cores(r[0])]
    shared = [r for r in runs if _shares_cores(r[0])]
    return (own, shared) if own and shared else (runs, [])


def _compute_share(ctx: Context, c: Summary, fit: Fitted) -> float:
    """The share of the core sharing's stretch its ops take (0 to 1) for which the layout's
    modelled compute is its measured compute (a layout whose pinned core-mates are TP peers:
    costs.shared_compute_share). The compute is linear in the share (its parts stretch by
    1 + share x (k - 1)): the line through 0 and 1, clamped to them where no share in between
    reproduces the measured compute (the calibration's [check] shows the miss)."""
    def f(x: float) -> float:  # the modelled compute at share x
        return breakdown(ctx, replace(fit, shared_compute_share=x)).compute_total_s
    at0, at1 = f(0.0), f(1.0)
    return min(1.0, max(0.0, (c.compute_s - at0) / (at1 - at0) if at1 > at0 else 1.0))


def _shared_host(ctx: Context, c: Summary, fit: Fitted) -> float:
    """What each core-mate adds to a rank's host time (`Fitted.shared_host_extra`) for which a
    layout whose ranks share cores simulates its measured step, the host time per layer pass
    held (fitted on the layouts whose ranks each have a core); 0 where the turns alone already
    reach the step (the calibration's [check] shows the miss)."""
    def f(x: float) -> float:
        return breakdown(ctx, replace(fit, shared_host_extra=x)).step_s - c.step_s
    if f(0.0) >= -1e-9:
        return 0.0
    return _secant(f, fit.shared_host_extra or 0.1, "host time's stretch per core-mate")


def overlapped(ctx: Context) -> bool:
    """Whether a layout's DP collectives run while its ranks compute (megatron-core's
    `overlap_grad_reduce` or `overlap_param_gather`, with DP)."""
    perf = ctx.cfg.performance
    return ctx.dp * ctx.cp > 1 and (perf.overlap_grad_reduce or perf.overlap_param_gather)


def _overlap_dp(runs: list[tuple[Context, Summary]], fit: Fitted) -> Fitted:
    """What an overlapped DP collective takes beyond its latency and bytes, per bucket: first
    `Fitted.overlap_dp_s` (model revision 19), for which each overlapped layout whose DP peers
    run on different cores has its modelled DP collectives take their measured time
    (`solver.dp_figure`: less the waiting for the slowest replica where that is priced apart;
    linear in it), averaged over them; then, given it, `Fitted.overlap_peer_core_dp_s` per ring
    step (model revision 21) from those whose DP peers share a core (comm.dp_peers_share_a_core:
    the same solve). Where every overlapped layout's peers share a core they give
    `overlap_dp_s` and no step's time is fitted (as before revision 21). 0 where the transport
    alone reaches the figure; `fit` unchanged where none has DP's time measured."""
    together: list[tuple[Context, Summary]] = []
    apart: list[tuple[Context, Summary]] = []
    for r in runs:
        (together if dp_peers_share_a_core(r[0], core_share(r[0], fit)) else apart).append(r)
    fit = _fixed_time_of(apart or together, fit, lambda f, v: replace(f, overlap_dp_s=v))
    return _fixed_time_of(together if apart else [], fit,
                          lambda f, v: replace(f, overlap_peer_core_dp_s=v))


def _fixed_time_of(runs: list[tuple[Context, Summary]], fit: Fitted,
                   put: Callable[[Fitted, float], Fitted]) -> Fitted:
    """`fit` with a DP fixed time (`put(fit, x)` sets it: `_dp_fixed_time`) at its mean over
    `runs`; unchanged where none of them has DP's time measured or the time adds nothing to its
    DP."""
    got = [x for ctx, c in runs for target in (dp_figure(ctx, c, fit),) if target
           for x in (_dp_fixed_time(ctx, lambda v: put(fit, v), target),)
           if x is not None]
    return put(fit, fmean(got)) if got else fit


def _chunk_host(runs: list[tuple[Context, Summary]], fit: Fitted) -> Fitted:
    """The host time per model chunk pass (`Fitted.host_s_per_chunk_pass`, model revision 22)
    for which each of `runs` (pipeline layouts whose ranks each have a core) has its modelled
    host time (`step.Breakdown.host_s`, linear in it) at its measured host gaps
    (`Summary.host_s`), averaged; at least 0; `fit` unchanged where none has its host time
    measured or the time adds nothing to its host time."""
    solved = (_solved(lambda v: breakdown(ctx, replace(fit, host_s_per_chunk_pass=v)).host_s,
                      c.host_s) for ctx, c in runs if c.host_s is not None)
    got = [x for x in solved if x is not None]
    return replace(fit, host_s_per_chunk_pass=fmean(got)) if got else fit


def _pipelines(runs: list[tuple[Context, Summary]]) -> tuple[list, list]:
    """(the layouts that fit every other constant, the pipeline layouts whose ranks each have a
    core that give the host time per chunk pass alone: `_chunk_host`) where the fit has both
    and the others have none with a pipeline; else (every layout, none). A chunk pass of a
    layout without a pipeline holds every layer slot, so its host time per chunk pass and per
    layer slot are one figure; a pipeline's one-layer chunks tell them apart."""
    pipe = [r for r in runs if r[0].pp > 1 and not _shares_cores(r[0])]
    rest = [r for r in runs if r not in pipe]
    return (rest, pipe) if pipe and rest and not any(ctx.pp > 1 for ctx, _ in rest) else (runs, [])


def solve_joint(items: Sequence[tuple[Summary, Any]]) -> Fitted:
    """The constants of several measured layouts ((summary, config) each; one: `solver.solve`'s
    exact fit). The layouts must be of one system, model and precision (the caller checks)."""
    if len(items) == 1:
        return solve(*items[0])
    every = [(Context.of(config_of(c, cfg)), c) for c, cfg in items]
    # where some layouts overlap their DP collectives with compute and the others have DP too,
    # the others fit every other constant as before and the overlapped ones what an overlapped
    # collective adds (model revision 19): their compute and host time run beside collectives
    # the others never overlap; where only overlapped layouts have DP, they give the transport
    # its DP figure as before and no such time is fitted
    ovl = [r for r in every if overlapped(r[0])]
    plain = [r for r in every if not overlapped(r[0])]
    split = bool(ovl) and any(ctx.dp * ctx.cp > 1 for ctx, _ in plain)
    runs, ovl = (plain, ovl) if split else (every, [])
    # a pipeline layout whose ranks each have a core, next to layouts without a pipeline, gives
    # the host time per chunk pass and nothing else (model revision 22)
    runs, pipe = _pipelines(runs)
    own, shared = _core_split(runs)
    # where the cores are shared by some layouts only, those layouts alone give what the
    # sharing changes beyond compute: the transport (a peer waiting for a core lengthens every
    # call) and what a core-mate adds to the host time
    rest = shared or runs
    fit = with_probe(_initial(runs[0][1], runs[0][0]), runs)
    for _ in range(60):
        new = _call_times(own, fit) or mean([_compute(ctx, c, fit) for ctx, c in own])
        mates = [(ctx, c) for ctx, c in shared if tp_peers_share_a_core(
            ctx, stage_core_share(ctx, breakdown(ctx, new).core_share))]
        if mates:  # where the sharing shows: in the ops or between them
            new = replace(new, shared_compute_share=fmean(
                [_compute_share(ctx, c, new) for ctx, c in mates]))
        new = _peer_wait(rest, new)
        # the bytes' rate from the layouts whose ranks each have a core (every layout where none
        # shares), the latency and what the sharing adds to DP from the others (revision 15)
        link = _shared_link(own, new, shared)
        if link is not None:
            new = _with_pp(rest, link)
        else:
            new = mean([_comm(ctx, new, c, breakdown(ctx, new)) for ctx, c in rest
                        if c.exposed or c.dp_total_s] or [new])
        # the host time per layer pass closes the steps of the layouts whose ranks each have a
        # core (every layout where none shares); what a core-mate adds to the host time closes
        # the others' (model revision 18)
        new = with_probe(mean([_close_step(ctx, new, c) for ctx, c in own]), runs)
        if shared:
            new = replace(new, shared_host_extra=fmean(
                [_shared_host(ctx, c, new) for ctx, c in shared]))
        new = _overlap_dp(ovl, _chunk_host(pipe, new))
        done = _same(new, fit)
        fit = new
        if done:
            break
    return mean([fit_memory(ctx, c, fit) for ctx, c in every])
