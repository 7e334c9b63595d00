"""One training step, evaluations and time-to-train: the planner's prediction for a Config.

The step comes from the simulation of Megatron's schedule (simulate.py); `estimate` is a closed
form of the same costs that the sweep uses to pick the candidates it simulates:
step ~ (1 + (PP-1)/(VP x m)) x busy + exposed DP + contention + end-of-step work.
Time-to-train = (steps x step + the first step's extra cost + evaluations x evaluation + run
overhead) x the checker's score scaling (convergence.py). The fitted constants are an argument
(`calibrate.fitted()` solves them); nothing here imports them back.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from ..config.derived import model_flops_per_sequence
from ..config.rules import rules_for
from ..config.schema import Config
from . import compute, simulate
from .calibrate.constants import ASSUMED, Fitted
from .context import Context
from .convergence import Schedule, convergence, schedule
from .costs import dp_replicas_wait, plan
from .memory import memory
from .pipeline import bubble_fraction

__all__ = ["Context", "Breakdown", "Prediction", "breakdown", "estimate_step_s", "predict",
           "predict_context"]


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Seconds of one step on the busiest GPU (a pipeline rank with the most compute); they sum
    to the step, which ends for every rank when the last one (`critical_rank`) is done."""
    compute_s: dict[str, float]
    """Compute by part (qkv, attention, proj, ffn_up, ffn_down, logits, elementwise), each
    including its share of the DP slowdown (as a profiler would measure the kernels)."""
    dp_slowdown_s: float
    """Compute lost to the SMs and HBM bandwidth the overlapped DP collectives take (already in
    compute_s)."""
    tp_s: float
    cp_s: float
    pp_s: float
    """Waiting for a pipeline send."""
    bubble_s: float
    """Other waiting: for input (pipeline fill and drain), and at the step's end for the rank
    that finishes last."""
    dp_exposed_s: float
    """Waiting for parameter gathers and for the last reduce-scatters, and for the parameter
    all-gather after the optimizer where it is not overlapped (a profile counts it in DP); and
    the passes' host time while a DP collective ran (`dp_host_s`)."""
    optimizer_s: float
    """End-of-step work: scaling the gradients, the optimizer, zeroing the gradient buffer, host."""
    dp_total_s: float
    """DP collective time before overlap (not a step component)."""
    critical_rank: int
    """The pipeline rank that finishes last (the others wait for it)."""
    rank: int = 0
    """The pipeline rank this breakdown describes: the busiest one (`busiest_rank`), or the one
    `breakdown` was asked for (a calibration's compared rank)."""
    recompute_s: float = 0.0
    """Forward recomputation (full recompute), included in compute_s parts."""
    host_s: float = 0.0
    """Host time with nothing running: of the passes (systems/fitted `host_s_per_layer_pass`, the
    systems' `host_s_per_layer_token`) and of the step outside them (systems `host_s_per_step`)."""
    core_share: float = 1.0
    """Ranks per core where ranks share cores (`shared_cores`): their stretch of compute and
    host time is included (a stage's own peers throughout, other stages on the core in turns:
    `core_turns_s`)."""
    dp_peer_wait_s: float = 0.0
    """Of the exposed DP, the replicas' waiting for the slowest of them (`peer_wait_s`)."""
    core_turns_s: float = 0.0
    """Compute lost to the other pipeline stages on this rank's core (costs.stages_per_core),
    included in compute_s, as dp_slowdown_s is."""
    dp_host_s: float = 0.0
    """Of the exposed DP, the passes' host time while an overlapped DP collective ran, not in
    host_s: a profile counts a piece with communication and no compute as exposed
    communication (profile/analysis.py), so the Python between ops under a DP collective reads
    as DP (model revision 19; simulate.covered)."""

    @property
    def compute_total_s(self) -> float:
        return sum(self.compute_s.values())

    @property
    def step_s(self) -> float:
        return (self.compute_total_s + self.tp_s + self.cp_s + self.pp_s + self.bubble_s
                + self.dp_exposed_s + self.optimizer_s + self.host_s)

    @property
    def bubble_fraction(self) -> float:
        busy = self.compute_total_s + self.tp_s + self.cp_s
        return (self.bubble_s + self.pp_s) / busy if busy else 0.0

    def as_dict(self) -> dict:
        out = {f"compute_{k}_s": v for k, v in self.compute_s.items()}
        out.update(compute_total_s=self.compute_total_s, dp_slowdown_s=self.dp_slowdown_s,
                   tp_s=self.tp_s, cp_s=self.cp_s, pp_s=self.pp_s, bubble_s=self.bubble_s,
                   dp_s=self.dp_exposed_s, dp_peer_wait_s=self.dp_peer_wait_s,
                   core_turns_s=self.core_turns_s, dp_host_s=self.dp_host_s,
                   optimizer_s=self.optimizer_s, host_s=self.host_s,
                   bubble_fraction=self.bubble_fraction, dp_unoverlapped_s=self.dp_total_s,
                   critical_rank=self.critical_rank, rank=self.rank)
        return out


def rank_compute(ctx: Context, fit: Fitted, rank: int) -> dict[str, float]:
    """Compute by part of one step on pipeline rank `rank`, without contention: every
    microbatch through every chunk, forward + backward; the elementwise part includes the
    per-step transposes of gathered NVFP4 weights."""
    key = (ctx.key, fit, rank)
    if key not in _PER_MB:
        if len(_PER_MB) > 5000:
            _PER_MB.clear()
        per: dict[str, float] = {}
        chunks = plan(ctx, fit).chunks[rank]
        for c in chunks:
            for pt in (c.fwd, c.bwd):
                for k in (*compute.PARTS, "elementwise"):
                    per[k] = per.get(k, 0.0) + getattr(pt, k)
        _PER_MB[key] = (per, sum(c.first_fwd_s for c in chunks))
    per, first = _PER_MB[key]
    out = {k: v * ctx.microbatches for k, v in per.items()}
    out["elementwise"] += first
    return out


_PER_MB: dict[tuple, tuple[dict[str, float], float]] = {}


_SIMS: dict[tuple, dict[int, tuple[simulate.Sim, ...]]] = {}


def busiest_rank(ctx: Context, fit: Fitted) -> int:
    """The pipeline rank with the most compute per step (the lowest such rank on a tie): a GPU
    holding a full share of the layers. The breakdown describes it, whichever rank happens to
    finish last, so the calibration (calibrate/solver.py) does not jump between ranks with 15 and 16
    layers when a small DP cost moves the last finisher."""
    rows = plan(ctx, fit).chunks
    work = [sum(c.fwd.total + c.bwd.total for c in row) for row in rows]
    return max(range(len(rows)), key=lambda r: (work[r] > max(work) * (1 - 1e-12), -r))


def comm_core_fraction(ctx: Context, fit: Fitted) -> float:
    """The share of its communication time a rank keeps a core busy: fitted, else the system's."""
    phi = fit.comm_core_fraction
    return ctx.system.comm_core_fraction if phi is None else phi


def core_share(ctx: Context, fit: Fitted) -> float:
    """How much longer compute and host time take where the ranks share `shared_cores` cores
    (systems; a development machine): the CPU time the ranks ask for per unit of step time,
    over the cores, when above 1; solved with the step it lengthens (bisection). The CPU time
    of a rank: its compute and host time at a core each, and `comm_core_fraction` of its
    communication (exposed TP, CP and PP, the DP collectives' whole duration). With the ranks
    pinned to the cores (systems `pin_ranks`, parallel/cores.py), the ranks per core: peers of
    one pipeline stage running in step, each at its share of the core, and where a core holds
    several stages, those taking turns (costs.stage_core_share, simulate.py)."""
    cores = ctx.system.shared_cores
    world = ctx.tp * ctx.pp * ctx.cp * ctx.dp
    if not cores or world <= cores:
        return 1.0
    if ctx.system.pin_ranks:
        return float(math.ceil(world / cores))
    phi = comm_core_fraction(ctx, fit)

    def excess(k: float) -> float:
        b = _breakdown(ctx, replace(fit, core_share=k))
        comm = phi * (b.tp_s + b.cp_s + b.pp_s + b.dp_total_s)
        demand = world * ((b.compute_total_s + b.host_s + b.dp_host_s) / k + comm) / b.step_s / cores
        return k - max(1.0, demand)
    lo, hi = 1.0, world / cores
    if excess(lo) >= 0:
        return 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if excess(mid) >= 0 else (mid, hi)
    return (lo + hi) / 2


def breakdown(ctx: Context, fit: Fitted, rank: int | None = None) -> Breakdown:
    """The simulated step of this layout at ctx.microbatches, as its busiest GPU spends it (or
    pipeline rank `rank`: the rank a calibration's figures describe), with the ranks' share of
    the cores where they share them."""
    k = core_share(ctx, fit) if fit.core_share == 1 else fit.core_share
    b = _breakdown(ctx, replace(fit, core_share=k) if k != fit.core_share else fit, rank)
    return replace(b, core_share=k) if k != 1 else b


def _breakdown(ctx: Context, fit: Fitted, rank: int | None = None) -> Breakdown:
    m = ctx.microbatches
    key = (ctx.key, fit)
    if key not in _SIMS:
        if len(_SIMS) > 2000:
            _SIMS.clear()
        _SIMS[key] = {}
    rank = busiest_rank(ctx, fit) if rank is None else rank
    p = plan(ctx, fit)
    s = simulate.run(p, m, _SIMS[key], rank=rank)
    gather = p.param_gather_s  # in the plan's end-of-step work; exposed DP for a profile
    parts = rank_compute(ctx, fit, rank)
    # the DP collectives' contention and the turns of stages sharing a core, as a profile
    # measures them: in the kernels' time
    scale = 1 + (s.slowdown_s + s.turns_s) / s.compute_s if s.compute_s else 1.0
    recompute = 0.0
    if ctx.cfg.performance.recompute == "full":
        recompute = m * sum(c.fwd.total for c in p.chunks[rank])
    b = Breakdown(compute_s={k: v * scale for k, v in parts.items()}, dp_slowdown_s=s.slowdown_s,
                  tp_s=s.tp_s, cp_s=s.cp_s, pp_s=s.pp_s, bubble_s=s.bubble_s + s.sync_s,
                  dp_exposed_s=s.dp_wait_s + s.dp_drain_s + gather + s.host_under_dp_s,
                  optimizer_s=s.finalize_s + s.optimizer_s - gather, dp_total_s=s.dp_total_s,
                  critical_rank=s.critical_rank, rank=rank, recompute_s=recompute,
                  host_s=s.host_s - s.host_under_dp_s, core_turns_s=s.turns_s,
                  dp_host_s=s.host_under_dp_s)
    # one waiting per step, the same on every pipeline rank: of the critical rank's rest, the
    # step less its exposed DP as `calibrate.solver._peer_wait` measures it (model revision 21:
    # with the host time under a DP collective, which had stayed in the rest)
    crit = s if rank == s.critical_rank else simulate.run(p, m, _SIMS[key])
    wait = peer_wait_s(ctx, fit, crit.step_s - crit.dp_wait_s - crit.dp_drain_s - gather
                       - crit.host_under_dp_s)
    return replace(b, dp_exposed_s=b.dp_exposed_s + wait, dp_peer_wait_s=wait) if wait else b


def peer_wait_s(ctx: Context, fit: Fitted, rest_s: float) -> float:
    """The DP replicas' waiting for the slowest of them at the gradient collectives, exposed:
    `Fitted.dp_peer_wait` of the rest of the step `rest_s`, where the DP groups' ranks do not
    share one core (costs.dp_replicas_wait); 0 without DP or where not measured. A replica's
    work between two synchronisations takes its own core's or device's time: the faster waits."""
    w = fit.dp_peer_wait
    if not w or not dp_replicas_wait(ctx, fit.core_share):
        return 0.0
    return w * rest_s


def estimate_step_s(ctx: Context, fit: Fitted) -> float:
    """Closed-form step time (the sweep's fast estimate; predictions use the simulation): the
    busiest rank's passes, the interleaved bubble, the last chunk's reduce-scatter and the first
    chunk's gather exposed, the rest of DP slowing compute, and the end-of-step work."""
    p = plan(ctx, fit)
    busy = ctx.microbatches * p.busy_mb_s
    first = p.chunks[0][0]
    c = p.chunks[0][-1]
    dp_total = sum(ch.reduce_s + ch.gather_s for ch in p.chunks[0])
    exposed = first.reduce_s + simulate.first_gather_s(first, ctx.vp > 1 and p.overlap_param)
    slowdown = max(0.0, dp_total - exposed) * p.inflation(c.bwd, c.work_bwd)
    return ((1 + bubble_fraction(ctx)) * busy + exposed + slowdown
            + max(p.finalize_s) + p.optimizer_s + p.zero_s + p.host_s + p.host_step_s)


def eval_time_s(ctx: Context, fit: Fitted, samples: int) -> float:
    """One evaluation: forward passes of `samples` sequences over the DP replicas on the busiest
    rank (compute and TP/CP of the forward), plus the pipeline fill, plus the part of its
    parameter all-gather the passes do not hide (`eval_gather_exposed_s`)."""
    per_replica = math.ceil(samples / ctx.dp)
    n_mb = math.ceil(per_replica / ASSUMED.eval_micro_batch_size)
    fwd = plan(ctx, fit).fwd_mb_s * ASSUMED.eval_micro_batch_size / ctx.mbs
    fill = (ctx.pp - 1) / ctx.vp if ctx.pp > 1 else 0.0
    return (n_mb + fill) * fwd + eval_gather_exposed_s(ctx, fit, n_mb, fwd)


def eval_gather_exposed_s(ctx: Context, fit: Fitted, n_mb: int, fwd_mb_s: float) -> float:
    """The evaluation's parameter all-gather that its forward passes do not hide, on pipeline
    rank 0 (train.evaluation.GatherAhead): chunk 0's first bucket used (its layout's last) before
    any forward; chunk i's
    gather, dispatched when chunk i-1's first forward starts and queued behind the earlier ones,
    against the min(PP, microbatches) forwards of chunk i-1 the interleaved forward-only schedule
    runs before chunk i's first (one chunk at VP 1: its bucket chain overlaps the rest)."""
    chunks = plan(ctx, fit).chunks[0]
    per_chunk = fwd_mb_s / len(chunks) * (min(ctx.pp, n_mb) if len(chunks) > 1 else n_mb)
    exposed = start = chunks[0].gather_s * chunks[0].last_bucket_share
    done = chunks[0].gather_s
    for c in chunks[1:]:
        done = max(done, start) + c.gather_s        # dispatched at chunk i-1's first forward
        wait = max(0.0, done - (start + per_chunk))
        exposed, start = exposed + wait, start + per_chunk + wait
    return exposed


@dataclass(frozen=True, slots=True)
class Prediction:
    system: str
    racks: int
    nodes: int
    tp: int
    pp: int
    vp: int
    cp: int
    dp: int
    minibs: int
    mbs: int
    gbs: int
    precision: str
    recompute: str
    step_time_s: float
    time_to_train_min: float
    mfu: float
    memory_per_gpu_gb: float
    fits: bool
    samples_to_converge: float
    steps: int
    evaluations: int
    eval_time_s: float
    breakdown: dict
    memory: dict
    first_step_extra_s: float = 0.0
    score_scale: float = 1.0
    """The RCP checker's scaling of a run faster than the RCP mean (GBS below 1152)."""
    time_to_train_range_min: tuple[float, float] = (0.0, 0.0)
    """Time-to-train if the run needs one standard deviation of the reference runs fewer or
    more samples (the convergence spread of the RCP data)."""
    simulated: bool = True
    """Step from the schedule simulation (False: the sweep's closed-form estimate)."""
    why_not: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def layout(self) -> str:
        return f"TP{self.tp}-PP{self.pp}-VP{self.vp}-CP{self.cp}"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["layout"] = self.layout
        return d


def predict(cfg: Config, fit: Fitted) -> Prediction:
    """The planner's prediction for a (layout-valid) config."""
    return predict_context(Context.of(cfg), fit)


def time_to_train_s(step_s: float, ev_s: float, sch: Schedule) -> float:
    return (sch.steps * step_s + ASSUMED.first_step_extra_s + sch.evaluations * ev_s
            + ASSUMED.run_overhead_s) * sch.score_scale


def predict_context(ctx: Context, fit: Fitted, *, simulated: bool = True) -> Prediction:
    """Prediction for a resolved layout (the sweep varies `ctx.microbatches` of one layout);
    `simulated=False` takes the closed-form step (no breakdown)."""
    cfg = ctx.cfg
    minibs = ctx.microbatches * ctx.mbs
    rules = rules_for(cfg.run.benchmark)
    if simulated:
        b = breakdown(ctx, fit)
        step_s, bd = b.step_s, b.as_dict()
    else:
        step_s, bd = estimate_step_s(ctx, fit), {}
    mem = memory(ctx, fit)
    gbs = minibs * ctx.dp
    sch = schedule(rules, gbs, ctx.precision)
    ev = eval_time_s(ctx, fit, rules.eval_samples)
    ttt = time_to_train_s(step_s, ev, sch)
    band = []
    conv = convergence(gbs, ctx.precision, rules.name)
    for sign in (-1, 1):
        band.append(time_to_train_s(step_s, ev, schedule(rules, gbs, ctx.precision,
                                                         conv.samples + sign * conv.stdev)) / 60)
    per_gpu_flops = model_flops_per_sequence(cfg.model) * minibs / (ctx.tp * ctx.pp * ctx.cp)
    mfu = per_gpu_flops / step_s / (ctx.system.peak_tflops(ctx.precision) * 1e12)
    nodes = math.ceil(ctx.dp * ctx.tp * ctx.pp * ctx.cp / ctx.system.gpus_per_node)
    return Prediction(
        system=cfg.system.id, racks=cfg.system.racks, nodes=nodes, tp=ctx.tp, pp=ctx.pp, vp=ctx.vp,
        cp=ctx.cp, dp=ctx.dp, minibs=minibs, mbs=ctx.mbs, gbs=gbs,
        precision=ctx.precision, recompute=cfg.performance.recompute, step_time_s=step_s,
        time_to_train_min=ttt / 60, mfu=mfu, memory_per_gpu_gb=mem.total_gb, fits=mem.fits,
        samples_to_converge=sch.samples_to_converge, steps=sch.steps, evaluations=sch.evaluations,
        eval_time_s=ev, breakdown=bd, memory=mem.as_dict(), first_step_extra_s=ASSUMED.first_step_extra_s,
        score_scale=sch.score_scale, time_to_train_range_min=(band[0], band[1]), simulated=simulated,
        why_not="" if mem.fits else mem.why_not())
