"""Every feasible layout for a system and scale, ranked by predicted time-to-train.

Candidates: TP x PP x CP dividing the GPUs used per rack (on 8-GPU systems: TP dividing the
node, CP and PP spanning nodes, the job's GPUs a multiple of TP x PP x CP), every VP and MiniBS
(a multiple of PP)
the config validator accepts (pipeline split, microbatches vs PP, the LR rule, GBS <= the largest
RCP), checked for memory. Every candidate is first estimated with the closed form
(`step.estimate_step_s`); the layouts of the best `SIMULATED_LAYOUTS` fitting candidates are then
predicted by the schedule simulation at every batch size, and those lead the ranking by their
simulated time-to-train. Fixed values (`tp=4`, ...) narrow the sweep.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import product

from ..config.rules import lr_passes_checker, rules_for
from ..systems import load_system
from .calibrate.constants import Fitted
from .calibrate import fitted
from .spec import layout_problems, make_config
from .step import Context, Prediction, predict_context

SIMULATED_LAYOUTS = 6
"""Layouts (all their batch sizes) re-predicted by the simulation after the closed-form screen."""


NODE_MAX_GBS = 2304
"""Largest GBS swept on 8-GPU systems: the second RCP batch. Their jobs are small (a replica
spans 8 nodes or more, DP is often below 8), so a layout has thousands of batch sizes up to
4608; above 2304 a run needs 368,640 samples or more, which costs more time than a larger step
saves at these scales."""
NODE_CP = (1, 2, 4, 8, 16)
"""CP sizes swept on 8-GPU systems (powers of two that split the 8,192-token sequence)."""
NODE_PP = (1, 2, 4, 8, 16, 32)
"""PP sizes swept on 8-GPU systems (divisors of the 405B's 128 pipeline slots, up to 32)."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True, slots=True)
class Fixed:
    """Layout values the user fixed (None: sweep it)."""
    tp: int | None = None
    pp: int | None = None
    vp: int | None = None
    cp: int | None = None
    minibs: int | None = None
    mbs: int = 1
    precision: str | None = None
    recompute: tuple[str, ...] = ("none",)


def layouts(system: str, racks: int, fixed: Fixed = Fixed(), benchmark: str = "llama31_405b"):
    """(config at the smallest batch, valid MiniBS values) of every layout the validator accepts.

    Each layout is validated in full once, at its smallest batch; its other batch sizes are
    multiples of PP x MBS up to the largest RCP batch, so only the LR rule, which depends on GBS
    alone, is re-checked (`config.rules.lr_passes_checker`, the validator's own test)."""
    spec = load_system(system)
    rules = rules_for(benchmark)
    per_rack = spec.gpus_used_per_rack
    pick = lambda v, options: [v] if v is not None else options  # noqa: E731
    tps: Sequence[int]
    cps: Sequence[int]
    pps: Sequence[int]
    if spec.node_nvlink_domain:   # 8-GPU nodes: TP in the node, CP and PP may span nodes
        tps, cps, pps = divisors(per_rack), NODE_CP, NODE_PP
    else:                         # the model-parallel group inside one NVLink domain
        tps = cps = pps = divisors(per_rack)
    for tp, cp, pp in product(pick(fixed.tp, tps), pick(fixed.cp, cps), pick(fixed.pp, pps)):
        mp = tp * pp * cp
        if (racks * per_rack) % mp or (not spec.node_nvlink_domain and per_rack % mp):
            continue
        dp = racks * per_rack // mp
        unit = pp * fixed.mbs
        top = min(rules.max_gbs, NODE_MAX_GBS) if spec.node_nvlink_domain else rules.max_gbs
        minibs_opts = pick(fixed.minibs, list(range(unit, top // dp + 1, unit)))
        if not minibs_opts:
            continue
        for vp, rc in product(pick(fixed.vp, divisors(128 // pp) if pp > 1 else [1]), fixed.recompute):
            first = make_config(system, racks, tp=tp, pp=pp, vp=vp, cp=cp, minibs=minibs_opts[0],
                                mbs=fixed.mbs, precision=fixed.precision, recompute=rc)
            found = layout_problems(first)
            if fixed.minibs is not None:
                if not found:
                    yield first, minibs_opts
                continue
            if [p for p in found if not p.startswith("GBS")]:
                continue
            ok = [mb for mb in minibs_opts if lr_passes_checker(rules, mb * dp)]
            if ok:
                yield first, ok


def sweep(system: str, racks: int, fixed: Fixed = Fixed(), benchmark: str = "llama31_405b",
          fit: Fitted | None = None, simulated_layouts: int = SIMULATED_LAYOUTS) -> list[Prediction]:
    """Predictions of every valid candidate: those that fit first; among them the simulated
    ones (the best layouts of the closed-form screen) by simulated time-to-train, then the rest
    by their estimate. A layout that does not fit at a batch size is not tried at larger ones
    (memory grows with MiniBS)."""
    fit = fit or fitted()
    screened: list[tuple[Prediction, Context]] = []
    for cfg, minibs_opts in layouts(system, racks, fixed, benchmark):
        ctx0 = Context.of(cfg)
        for mb in minibs_opts:
            ctx = replace(ctx0, microbatches=mb // fixed.mbs)
            pred = predict_context(ctx, fit, simulated=False)
            screened.append((pred, ctx))
            if not pred.fits:  # memory only grows with MiniBS: one line says why not
                break
    screened.sort(key=lambda pc: (not pc[0].fits, pc[0].time_to_train_min))
    chosen: list[tuple] = []
    for pred, ctx in screened:
        if not pred.fits or len(chosen) >= simulated_layouts:
            break
        if ctx.key not in chosen:
            chosen.append(ctx.key)
    top = [predict_context(ctx, fit) for pred, ctx in screened if pred.fits and ctx.key in chosen]
    rest = [pred for pred, ctx in screened if not (pred.fits and ctx.key in chosen)]
    return sorted(top, key=lambda p: p.time_to_train_min) + rest


def best(system: str, racks: int, fixed: Fixed = Fixed()) -> Prediction:
    ranked = sweep(system, racks, fixed)
    if not ranked or not ranked[0].fits:
        why = ranked[0].why_not if ranked else "no layout passes the config validator"
        raise ValueError(f"no layout fits {racks} racks of {system}: {why}")
    return ranked[0]
