"""Solve the fitted constants (`constants.Fitted`) so that the simulated step of a measured
layout reproduces its measurement (`summary.Summary`): the published 128-rack step
(`summary.CALIBRATION`, four figures) or a profile folder's (`read_profile.from_profile`, which
adds each compute part, communication by kind and host gaps). One solver for both:

* compute: of the busiest GPU or the inner rank a summary names (`compared_rank`; a
  pipeline rank with a full share of the layers,
  `step.busiest_rank`; the measurement includes the contention of the overlapped DP
  collectives). GEMM and attention time are inversely proportional to their efficiency,
  elementwise time proportional to its passes: the FFN share gives the GEMM efficiency of the
  run's precision, the rest of the GEMM share the attention (the published write-up counts the
  fused attention as GEMMs; a profile measures the attention and each linear part apart, whose
  rate relative to the FFN's is `gemm_part_scale`), the non-GEMM share the elementwise passes;
* communication a profile measures: on a system with one transport (systems `one_transport`:
  a CPU's gloo), that transport's latency and bandwidth from TP's small and DP's large
  collectives (`_transport`), every kind following from them, the pipeline's sends keeping a
  scale solved with their bubble; elsewhere a scale per kind (TP, CP, PP, DP: measured /
  modelled time, latency and bytes alike, since a profile sees one message size per kind), a
  kind the profiled layout lacks taking the geometric mean of the measured ones (the same
  links, measured through other collectives), the NVLink efficiency the published fit's;
* the step is closed by one constant: the NVLink efficiency for the publication (secant on
  1/efficiency, which the communication time is proportional to), the host time per layer pass
  for a profile (it measured the host gaps);
* memory, when the profile recorded the allocator's peaks (a GPU): the activation scale and the
  fragmentation (`fit_memory`).

The contention depends on the constants, so this repeats until nothing moves (a handful of
rounds, each a few simulations). This module imports the model; the model never imports it: the
constants reach it as an argument (the package's `solve` and `fitted` import it when called).
"""
from __future__ import annotations

import math
from dataclasses import fields, replace
from functools import cache

from .. import compute
from ..context import Context
from ..costs import dp_peers_on_one_core, dp_replicas_wait, plan
from ..memory import memory
from ..spec import make_config
from ..step import Breakdown, breakdown, core_share, rank_compute
from .constants import ASSUMED, INITIAL, Fitted
from .precisions import with_probe
from .summary import CALIBRATION, KINDS, Summary

LINEAR = ("qkv", "proj", "logits")
"""Linear parts other than the FFN: their rate relative to the FFN's is fitted when measured."""


def config_of(c: Summary, cfg=None):
    """The config of the measured layout: `cfg` if given, the profiled config file, or the
    planner's config of the published layout."""
    if cfg is not None:
        return cfg
    if c.config:
        from ...config.load import load_config
        return load_config(c.config)
    return make_config(c.system, c.racks, tp=c.tp, pp=c.pp, vp=c.vp, cp=c.cp, minibs=c.minibs,
                       mbs=c.mbs, precision=c.precision)


def _secant(f, x0: float, what: str) -> float:
    """x with f(x) = 0, from x0 (f monotonic and nearly linear in x)."""
    y0 = f(x0)
    x1 = x0 * 1.05 if x0 else 1e-6
    for _ in range(30):
        y1 = f(x1)
        if abs(y1) < 1e-9 or y1 == y0:
            return x1
        x0, y0, x1 = x1, y1, x1 - y1 * (x1 - x0) / (y1 - y0)
        if x1 <= 0:
            raise ValueError(f"calibration: no positive {what} reproduces the measured step")
    return x1


def _close_step(ctx: Context, fit: Fitted, c: Summary) -> Fitted:
    """The closing constant (`Summary.closes`) for which the simulated step is the measured."""
    if c.closes == "nvlink_bus_efficiency":
        x = _secant(lambda x: breakdown(ctx, replace(fit, nvlink_bus_efficiency=1 / x)).step_s
                    - c.step_s, 1 / fit.nvlink_bus_efficiency, "NVLink time")
        return replace(fit, nvlink_bus_efficiency=1 / x)
    def f(x):
        return breakdown(ctx, replace(fit, host_s_per_layer_pass=x)).step_s - c.step_s
    # the rest of the model leaves no host time (the check shows the miss); within the secant's
    # own tolerance of the step, a rounding error of the sum (-4e-15 s) is no host time either
    if f(0.0) >= -1e-9:
        return replace(fit, host_s_per_layer_pass=0.0)
    return replace(fit, host_s_per_layer_pass=_secant(f, fit.host_s_per_layer_pass or 1e-6,
                                                      "host time per layer pass"))


def _modelled(ctx: Context, fit: Fitted, b: Breakdown, kind: str) -> float:
    """The model's time of a communication kind, as the profile measures it (DP: the
    collectives' total, with the parameter gather the optimizer runs when it is not overlapped)."""
    if kind == "DP":
        p = plan(ctx, replace(fit, core_share=b.core_share))  # the layout's own, as `b`'s
        gather = 0.0 if p.overlap_param else sum(c.gather_s for c in p.chunks[b.rank])
        return b.dp_total_s + gather
    return {"TP": b.tp_s, "CP": b.cp_s, "PP": b.pp_s + b.bubble_s}[kind]


def _transport(ctx: Context, fit: Fitted, target: dict) -> Fitted | None:
    """One round of the latency and bandwidth of a system with one transport (systems
    `one_transport`) from the two kinds whose messages differ most: TP's per-layer all-reduces
    (many, small: latency) and DP's gradient collectives (few, large: bandwidth), both measured
    in this one layout (`_link`). None where the layout lacks one of the two kinds."""
    if not (ctx.system.one_transport and ctx.tp > 1 and ctx.dp * ctx.cp > 1
            and target.get("TP") and target.get("DP")):
        return None
    return _link(fit, (ctx, target["TP"]), (ctx, target["DP"]))


def _link(fit: Fitted, tp: tuple[Context, float], dp: tuple[Context, float]) -> Fitted | None:
    """The one transport's latency L and x = 1 / nvlink_bus_efficiency (the bandwidth is
    nvlink_gbs x efficiency) for which the modelled TP time of layout `tp[0]` is `tp[1]` and the
    modelled DP time of layout `dp[0]` is `dp[1]` (one layout, or two: a joint fit). Each
    modelled time is linear in L and x: two figures, two unknowns. None where no positive
    latency and bandwidth reproduce both."""
    (tctx, t_target), (dctx, d_target) = tp, dp
    scale = dict(fit.comm_scale) | {"TP": 1.0, "DP": 1.0}
    base = replace(fit, comm_scale=tuple(sorted(scale.items())))
    lat0 = fit.collective_latency_s or tctx.system.collective_latency_s or 1e-3
    x0 = 1 / fit.nvlink_bus_efficiency

    def model(lat: float, x: float) -> tuple[float, float]:
        f = replace(base, collective_latency_s=lat, nvlink_bus_efficiency=1 / x)
        return (_modelled(tctx, f, breakdown(tctx, f), "TP"),
                _modelled(dctx, f, breakdown(dctx, f), "DP"))
    (t0, d0), (t1, d1), (t2, d2) = model(lat0, x0), model(2 * lat0, x0), model(lat0, 2 * x0)
    at, ad, bt, bd = (t1 - t0) / lat0, (d1 - d0) / lat0, (t2 - t0) / x0, (d2 - d0) / x0
    rt, rd = t_target - (t0 - at * lat0 - bt * x0), d_target - (d0 - ad * lat0 - bd * x0)
    det = at * bd - ad * bt
    if abs(det) < 1e-12 * max(abs(at * bd), abs(ad * bt), 1e-30):
        return None
    lat, x = (rt * bd - rd * bt) / det, (at * rd - ad * rt) / det
    if lat <= 0 or x <= 0:
        return None
    return replace(base, collective_latency_s=lat, nvlink_bus_efficiency=1 / x)


def _comm(ctx: Context, fit: Fitted, c: Summary, b: Breakdown) -> Fitted:
    """One round of the communication constants: on a system with one transport, its latency
    and bandwidth where the profile has both of TP and DP (`_transport`; every other kind then
    follows from them, scale 1, except the pipeline's, solved with its bubble); else each
    measured kind's time ratio applied."""
    exposed = dict(c.exposed)
    target = {k: exposed.get(k) for k in KINDS}
    target["DP"] = dp_figure(ctx, c, fit)
    present = {"TP": ctx.tp > 1, "CP": ctx.cp > 1, "PP": ctx.pp > 1, "DP": ctx.dp * ctx.cp > 1}
    link = _transport(ctx, fit, target)
    if link is not None:
        fit = link
        if present["PP"] and target["PP"]:
            pp = _pp_scale(ctx, fit, target["PP"], fit.scale("comm_scale", "PP"))
            fit = replace(fit, comm_scale=tuple(sorted((dict(fit.comm_scale) | {"PP": pp}).items())))
        return fit
    scale = dict(fit.comm_scale)
    ratios = {}
    for k in KINDS:
        model, t = _modelled(ctx, fit, b, k), target[k]
        if not present[k] or not t or model <= 0:
            continue
        if k != "PP":
            ratios[k] = t / model
    for k, r in ratios.items():
        scale[k] = scale.get(k, 1.0) * r
    if present["PP"] and target["PP"]:  # the sends and the bubble they cause, solved together
        scale["PP"] = _pp_scale(ctx, replace(fit, comm_scale=tuple(sorted(scale.items()))),
                                target["PP"], scale.get("PP", 1.0))
        if scale["PP"] > PP_FLOOR:  # else the bubble alone exceeds the measurement: no figure
            ratios["PP"] = 1.0
    measured = set(ratios) | {k for k in scale if present[k]}
    if measured and len(measured) < len(KINDS):
        # the kinds the layout lacks: the same machine's links, measured through the other
        # collectives
        solved = [k for k in measured if k in ratios] or sorted(measured)
        mean = math.exp(sum(math.log(scale[k]) for k in solved) / len(solved))
        for k in KINDS:
            if k not in measured:
                scale[k] = mean
    return replace(fit, comm_scale=tuple(sorted(scale.items())))


def dp_figure(ctx: Context, c: Summary, fit: Fitted) -> float | None:
    """The DP collectives' time the transport is fitted to: less the waiting for the slowest
    replica where the model prices that waiting apart (`step.peer_wait_s`: DP groups spanning
    cores or devices), the whole time where it does not (a group on one core: its members' turns,
    1-3 ms on the 2-core machine, stay the transport's)."""
    if dp_peers_on_one_core(ctx, core_share(ctx, fit)):
        return c.dp_total_s
    return c.dp_transfer_s


def _peer_wait(runs: list[tuple[Context, Summary]], fit: Fitted) -> Fitted:
    """The DP replicas' waiting for the slowest per second of the rest of the step
    (`Fitted.dp_peer_wait`): the mean over the layouts whose DP groups span cores or devices
    (costs.dp_replicas_wait) and whose summary measured it, of their waiting in DP over
    their step less its exposed DP; `fit` unchanged where none did."""
    got = []
    for ctx, c in runs:
        wait = dict(c.waiting).get("DP")
        if wait is None or not dp_replicas_wait(ctx, core_share(ctx, fit)):
            continue
        rest = c.step_s - dict(c.exposed).get("DP", 0.0)
        if rest > 0:
            got.append(wait / rest)
    return replace(fit, dp_peer_wait=sum(got) / len(got)) if got else fit


PP_FLOOR = 1e-3
"""The smallest pipeline-send scale (free sends): where even they leave more bubble than the
profile measured."""


def _pp_scale(ctx: Context, fit: Fitted, target: float, start: float) -> float:
    """The pipeline sends' scale for which the exposed PP time (sends and the bubble, which the
    sends lengthen) is the measured one; the smallest when even free sends leave more bubble."""
    def f(x):
        table = dict(fit.comm_scale) | {"PP": x}
        b = breakdown(ctx, replace(fit, comm_scale=tuple(sorted(table.items()))))
        return b.pp_s + b.bubble_s - target
    if f(PP_FLOOR) >= 0:
        return PP_FLOOR
    return _secant(f, start, "pipeline send time")


def _initial(c: Summary, ctx: Context) -> Fitted:
    if not c.parts:
        return INITIAL
    prior = fitted()
    prec = compute.gemm_precision(ctx)
    start = replace(prior, host_s_per_layer_pass=ctx.system.host_s_per_layer_pass)
    if prec != "nvfp4":
        start = replace(start, gemm_fraction=((prec, dict(ASSUMED.gemm_peak_fraction)[prec]),))
    return start


def compared_rank(ctx: Context, c: Summary, fit: Fitted, busiest: int) -> int:
    """The pipeline rank whose compute the summary's figures describe (`Summary.compute_of`):
    the busiest, or for "inner" the busiest of those holding neither the embedding nor the LM
    head (the busiest where the pipeline has no such rank: PP < 3). The fit subtracts this
    rank's own slowdown by the overlapped DP collectives from its measured compute, and `check`
    reports this rank's simulated compute beside it."""
    if c.compute_of == "inner" and ctx.pp >= 3:
        return max(range(1, ctx.pp - 1), key=lambda r: sum(rank_compute(ctx, fit, r).values()))
    return busiest


def _slowdown(ctx: Context, fit: Fitted, b: Breakdown, rank: int) -> float:
    """Pipeline rank `rank`'s compute lost to the overlapped DP collectives and to the other
    pipeline stages on its core (`b`: the busiest rank's breakdown, which is it where `rank` is
    the busiest)."""
    own = b if rank == b.rank else breakdown(ctx, fit, rank)
    return own.dp_slowdown_s + own.core_turns_s


def _compute(ctx: Context, c: Summary, fit: Fitted) -> Fitted:
    """One round of the compute constants (GEMM efficiency of the run's precision, the linear
    parts' and the attention's rates, the elementwise passes) for which the modelled compute of
    the busiest rank is the measured, the communication constants as in `fit`."""
    prec = compute.gemm_precision(ctx)
    parts = dict(c.parts)
    b = breakdown(ctx, fit)
    # ranks sharing cores: measured in the parts; no time per layer pass (a joint fit's
    # `_call_times` fits it, where two layouts separate it from the rates)
    fk = replace(fit, core_share=b.core_share, call_s=())
    rank = compared_rank(ctx, c, fk, b.rank)
    clean = c.compute_s - _slowdown(ctx, fit, b, rank)
    k = clean / c.compute_s
    now = rank_compute(ctx, fk, rank)  # seconds of each part per step
    fixed = sum(ch.first_fwd_s for ch in plan(ctx, fk).chunks[rank])
    eta0 = compute.gemm_peak_fraction(prec, fit)
    unit = {p: now[p] * eta0 for p in (*LINEAR, "ffn_up", "ffn_down")}
    unit["attention"] = now["attention"] * fit.attention_bf16_fraction
    unit["elementwise"] = (now["elementwise"] - fixed) / fit.elementwise_passes
    ffn = c.ffn_share_of_compute * clean
    eta = (unit["ffn_up"] + unit["ffn_down"]) / ffn
    scales = dict(fit.gemm_part_scale)
    # a part in another precision than the fitted one (the LM head under NVFP4:
    # compute.part_precision) keeps its time as modelled at its own precision's rate this round
    # (a probe's price of it follows the fitted one between rounds: precisions.with_probe)
    at = {p: now[p] / scales.get(p, 1.0) if compute.part_precision(ctx, p) != prec
          else unit[p] / scales.get(p, 1.0) / eta for p in LINEAR}
    if parts:  # a profile: each linear part's rate and the attention measured apart
        for p in LINEAR:
            if parts.get(p, 0.0) > 0 and unit[p] > 0:
                scales[p] = parts[p] * k / at[p]
        attn = parts.get("attention", 0.0) * k
    else:
        other = sum(at[p] * scales.get(p, 1.0) for p in LINEAR)
        attn = c.gemm_share_of_compute * clean - ffn - other
    if attn <= 0:
        raise ValueError(f"{c.source}: the GEMM share leaves no time for attention")
    passes = ((1 - c.gemm_share_of_compute) * clean - fixed) / unit["elementwise"]
    new = replace(fit, elementwise_passes=passes, attention_bf16_fraction=unit["attention"] / attn,
                  gemm_part_scale=tuple(sorted(scales.items())), call_s=())
    return (replace(new, nvfp4_gemm_peak_fraction=eta) if prec == "nvfp4"
            else replace(new, gemm_fraction=tuple(sorted((dict(fit.gemm_fraction)
                                                          | {prec: eta}).items()))))


def solve(c: Summary = CALIBRATION, cfg=None) -> Fitted:
    ctx = Context.of(config_of(c, cfg))
    fit = with_probe(_initial(c, ctx), [(ctx, c)])
    for _ in range(30):
        new = _peer_wait([(ctx, c)], _compute(ctx, c, fit))
        if c.exposed or c.dp_total_s:
            new = _comm(ctx, new, c, breakdown(ctx, new))
        new = with_probe(_close_step(ctx, new, c), [(ctx, c)])
        done = _same(new, fit)
        fit = new
        if done:
            break
    return fit_memory(ctx, c, fit)


def fit_memory(ctx: Context, c: Summary, fit: Fitted) -> Fitted:
    """The memory model's two measured constants: the activation scale (the allocated peak less
    the static buffers, which the model counts exactly: weights, gradients, optimizer state,
    over the modelled activations) and the allocator's fragmentation (reserved - allocated, over
    those activations). `fit` unchanged when the summary has no memory record."""
    if c.memory_allocated_gb is None:
        return fit
    m = memory(ctx, replace(fit, activation_scale=1.0, activation_fragmentation=None))
    static = m.weights_gb + m.grads_gb + m.optimizer_gb
    act = c.memory_allocated_gb - static
    if act <= 0 or m.activations_gb <= 0:
        raise ValueError(f"{c.source}: the measured peak ({c.memory_allocated_gb:.2f} GB allocated) "
                         f"is not above the model's weights, gradients and optimizer state "
                         f"({static:.2f} GB): the memory model does not describe this run")
    fit = replace(fit, activation_scale=act / m.activations_gb)
    if c.memory_reserved_gb is not None:
        fit = replace(fit, activation_fragmentation=max(
            0.0, (c.memory_reserved_gb - c.memory_allocated_gb) / act))
    return fit


def _numbers(f: Fitted) -> list[float]:
    out = []
    for fl in fields(f):
        v = getattr(f, fl.name)
        if isinstance(v, tuple):
            out += [x for _, x in v]
        elif v is not None:
            out.append(v)
    return out


def _same(a: Fitted, b: Fitted) -> bool:
    x, y = _numbers(a), _numbers(b)
    return len(x) == len(y) and all(abs(p / q - 1) < 1e-10 for p, q in zip(x, y) if q)


@cache
def fitted() -> Fitted:
    """The constants of the published calibration point (solved once per process)."""
    return solve()


def check(c: Summary, fit: Fitted, cfg) -> dict:
    """The calibration file's [check]: the simulated step and compute of the measured layout with
    the fitted constants, next to the measurement (they agree: the fit reproduces what it was
    fitted to)."""
    ctx = Context.of(config_of(c, cfg))
    b = breakdown(ctx, fit)
    rank = compared_rank(ctx, c, replace(fit, core_share=b.core_share, call_s=()), b.rank)
    sim = b if rank == b.rank else breakdown(ctx, fit, rank)
    out = {"simulated_step_s": b.step_s, "measured_step_s": c.step_s,
           "simulated_compute_s": sim.compute_total_s, "measured_compute_s": c.compute_s}
    if c.eager_step_s is not None:
        out["measured_eager_step_s"] = c.eager_step_s
    return out
