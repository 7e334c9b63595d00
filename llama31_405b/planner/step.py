"""One training step, evaluations and time-to-train: the planner's prediction for a Config.

step = (1 + bubble) x busy + exposed DP + optimizer, where busy = microbatches x (compute +
exposed TP + exposed CP of the slowest pipeline rank) + pipeline sends, and compute includes the
slowdown of kernels that share SMs with the overlapped DP collectives. Time-to-train = steps x
step + evaluations x evaluation + run overhead (calibration.ASSUMED.run_overhead_s).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..config.derived import model_flops_per_sequence
from ..config.rules import rules_for
from ..config.schema import Config
from . import comm, compute
from .calibration import ASSUMED, Fitted, fitted
from .context import Context
from .convergence import schedule
from .memory import memory
from .pipeline import bubble_fraction

__all__ = ["Context", "Breakdown", "Prediction", "breakdown", "predict", "predict_context", "critical"]


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Seconds of one step on the slowest GPU."""
    compute_s: dict[str, float]
    """Compute by part (qkv, attention, proj, ffn_up, ffn_down, logits, elementwise), each
    including its share of the DP slowdown (as a profiler would measure the kernels)."""
    dp_slowdown_s: float
    """Compute lost to the SMs the overlapped DP collectives occupy (already in compute_s)."""
    tp_s: float
    cp_s: float
    pp_s: float
    bubble_s: float
    dp_exposed_s: float
    optimizer_s: float
    bubble_fraction: float
    dp_total_s: float
    """DP collective time before overlap (not a step component)."""
    recompute_s: float = 0.0
    """Forward recomputation (full recompute), included in compute_s parts."""

    @property
    def compute_total_s(self) -> float:
        return sum(self.compute_s.values())

    @property
    def step_s(self) -> float:
        return (self.compute_total_s + self.tp_s + self.cp_s + self.pp_s + self.bubble_s
                + self.dp_exposed_s + self.optimizer_s)

    def as_dict(self) -> dict:
        out = {f"compute_{k}_s": v for k, v in self.compute_s.items()}
        out.update(compute_total_s=self.compute_total_s, dp_slowdown_s=self.dp_slowdown_s,
                   tp_s=self.tp_s, cp_s=self.cp_s, pp_s=self.pp_s, bubble_s=self.bubble_s,
                   dp_s=self.dp_exposed_s, optimizer_s=self.optimizer_s,
                   bubble_fraction=self.bubble_fraction, dp_unoverlapped_s=self.dp_total_s)
        return out


def dp_comm_s(ctx: Context) -> float:
    return comm.dp_time(ctx)


def tp_comm_parts(ctx: Context, fit: Fitted) -> tuple[float, float]:
    """TP (bandwidth seconds at full NVLink speed, latency seconds) per step on the slowest rank
    (used by the fit)."""
    st = critical(ctx, fit)[0]
    bw, lat = comm.tp_terms(ctx, st)
    return bw * ctx.microbatches, lat * ctx.microbatches


_CRITICAL: dict[tuple, tuple] = {}


def critical(ctx: Context, fit: Fitted):
    """(stage, compute parts, TP, CP) per microbatch of the slowest pipeline rank (cached: the
    sweep evaluates many batch sizes of one layout)."""
    key = (ctx.key, fit)
    if key not in _CRITICAL:
        if len(_CRITICAL) > 20000:
            _CRITICAL.clear()
        _CRITICAL[key] = _critical(ctx, fit)
    return _CRITICAL[key]


def _critical(ctx: Context, fit: Fitted):
    best = None
    for st in ctx.stages:
        parts = compute.stage_parts(ctx, st, fit)
        if ctx.cfg.performance.recompute == "full":
            parts = parts.scaled(4 / 3)
        tp = comm.tp_time(ctx, st, fit)
        if ctx.cfg.performance.recompute == "full":
            tp *= 1.4  # the recomputed forward repeats its 4 of the 10 collectives
        cp = comm.cp_time(ctx, st, compute.attention_time(ctx, fit), fit)
        total = parts.total + tp + cp
        if best is None or total > best[-1]:
            best = (st, parts, tp, cp, total)
    return best[:4]


def breakdown(ctx: Context, fit: Fitted | None = None) -> Breakdown:
    fit = fit or fitted()
    st, parts, tp, cp = critical(ctx, fit)
    m = ctx.microbatches
    comp = {k: getattr(parts, k) * m for k in (*compute.PARTS, "elementwise")}
    pp = comm.pp_time(ctx)
    busy_nodp = sum(comp.values()) + (tp + cp) * m + pp
    dp_s = comm.dp_time(ctx)
    dp_exp = comm.dp_exposed(ctx, dp_s, busy_nodp, fit)
    slowdown = ASSUMED.nccl_dp_ctas / ctx.system.sm_count * (dp_s - dp_exp)
    bf = bubble_fraction(ctx)
    busy = busy_nodp + slowdown
    base = sum(comp.values())
    comp = {k: v * (1 + slowdown / base) for k, v in comp.items()}
    shard = ctx.params_per_gpu / (ctx.dp * ctx.cp if ctx.cfg.optimizer.distributed else 1)
    opt = (shard * ASSUMED.optimizer_bytes_per_param / (ctx.system.hbm_tbs * 1e12)
           + ASSUMED.optimizer_fixed_s)
    return Breakdown(compute_s=comp, dp_slowdown_s=slowdown, tp_s=tp * m, cp_s=cp * m, pp_s=pp,
                     bubble_s=bf * busy, dp_exposed_s=dp_exp, optimizer_s=opt, bubble_fraction=bf,
                     dp_total_s=dp_s,
                     recompute_s=base / 4 if ctx.cfg.performance.recompute == "full" else 0.0)


def eval_time_s(ctx: Context, b: Breakdown, samples: int) -> float:
    """One evaluation: forward passes of `samples` sequences over the DP replicas (forward =
    1/3 of the compute and 4 of the 10 TP collectives), plus the pipeline fill."""
    per_replica = math.ceil(samples / ctx.dp)
    n_mb = math.ceil(per_replica / ASSUMED.eval_micro_batch_size)
    m = ctx.microbatches
    scale = ASSUMED.eval_micro_batch_size / ctx.mbs
    base = b.compute_total_s - b.dp_slowdown_s - b.recompute_s
    fwd = (base / 3 + b.tp_s * 0.4 + b.cp_s / 3) / m * scale
    fill = (ctx.pp - 1) / ctx.vp if ctx.pp > 1 else 0.0
    return (n_mb + fill) * fwd


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
    why_not: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def layout(self) -> str:
        return f"TP{self.tp}-PP{self.pp}-VP{self.vp}-CP{self.cp}"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["layout"] = self.layout
        return d


def predict(cfg: Config, fit: Fitted | None = None) -> Prediction:
    """The planner's prediction for a (layout-valid) config."""
    return predict_context(Context.of(cfg), fit)


def predict_context(ctx: Context, fit: Fitted | None = None) -> Prediction:
    """Prediction for a resolved layout (the sweep varies `ctx.microbatches` of one layout)."""
    cfg = ctx.cfg
    minibs = ctx.microbatches * ctx.mbs
    b = breakdown(ctx, fit)
    mem = memory(ctx)
    sch = schedule(rules_for(cfg.run.benchmark), minibs * ctx.dp)
    ev = eval_time_s(ctx, b, rules_for(cfg.run.benchmark).eval_samples)
    ttt = sch.steps * b.step_s + sch.evaluations * ev + ASSUMED.run_overhead_s
    per_gpu_flops = model_flops_per_sequence(cfg.model) * minibs / (ctx.tp * ctx.pp * ctx.cp)
    mfu = per_gpu_flops / b.step_s / (ctx.system.peak_tflops(ctx.precision) * 1e12)
    nodes = math.ceil(ctx.dp * ctx.tp * ctx.pp * ctx.cp / ctx.system.gpus_per_node)
    memd = {"weights_gb": mem.weights_gb, "grads_gb": mem.grads_gb, "optimizer_gb": mem.optimizer_gb,
            "activations_gb": mem.activations_gb, "fragmentation_gb": mem.fragmentation_gb,
            "reserved_gb": mem.reserved_gb,
            "capacity_gb": mem.capacity_gb}
    return Prediction(
        system=cfg.system.id, racks=cfg.system.racks, nodes=nodes, tp=ctx.tp, pp=ctx.pp, vp=ctx.vp,
        cp=ctx.cp, dp=ctx.dp, minibs=minibs, mbs=ctx.mbs, gbs=sch.gbs,
        precision=ctx.precision, recompute=cfg.performance.recompute, step_time_s=b.step_s,
        time_to_train_min=ttt / 60, mfu=mfu, memory_per_gpu_gb=mem.total_gb, fits=mem.fits,
        samples_to_converge=sch.samples_to_converge, steps=sch.steps, evaluations=sch.evaluations,
        eval_time_s=ev, breakdown=b.as_dict(), memory=memd,
        why_not="" if mem.fits else mem.why_not())
