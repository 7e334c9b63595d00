"""Samples to converge vs GBS, from the ruleset's reference convergence points (RCPs), and the
steps, evaluations and score scaling the benchmark then gives.

The RCP data are mlperf_logging's own (`rcp_checker/training_<ruleset>/rcps_<benchmark>.json`,
read through `config.rcp.pruned_stats`: the olympic mean and standard deviation of each RCP,
pruned as the checker prunes them; tests/test_rcp_lookup.py compares them with the checker's). For llama31_405b ruleset 6.0.0: GBS 1152 -> 313,344 samples
(std 10,642), 2304 -> 368,640, 4608 -> 493,056.

* Between RCPs the expected samples are the checker's linear interpolation (mean and spread).
* Below the smallest RCP there is no data. The checker compares such a run with the smallest
  RCP and accepts it when it is not much faster; a run faster than that RCP's mean has its score
  scaled up to it. The planner extends the RCPs' trend below the smallest one (the slope between
  the two smallest: fewer samples at smaller batches, 48 per unit of GBS for llama31_405b) for
  the samples the run needs, and applies the checker's scaling to the score. So a GBS below 1152
  trains fewer samples than 1152 but scores at best like the 1152 mean.
* Above the largest RCP the checker fails the run ("Missing RCP"): no prediction.
* NVFP4 versus the BF16 reference runs is a separate, stated factor
  (`calibrate.constants.ASSUMED.nvfp4_samples_factor`, 1.0).

A run stops at the first evaluation that reaches the target, so the steps are the samples rounded
up to the evaluation schedule of `config.rules.hparams`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from ..config.rcp import pruned_stats, rcp_file_for
from ..config.rules import BenchmarkRules, hparams
from .calibrate.constants import ASSUMED


@dataclass(frozen=True, slots=True)
class RcpPoint:
    gbs: int
    mean: float
    """Olympic mean of the reference runs' samples to converge."""
    stdev: float
    """Standard deviation of the reference runs (the checker's)."""


@cache
def rcp_points(benchmark: str = "llama31_405b") -> tuple[RcpPoint, ...]:
    """The pruned RCPs of the benchmark, by GBS."""
    return tuple(RcpPoint(bs, mean, sd) for bs, mean, sd in pruned_stats(rcp_file_for(benchmark)))


@dataclass(frozen=True, slots=True)
class Convergence:
    gbs: int
    samples: float
    """Samples the run is expected to need (NVFP4 factor applied)."""
    stdev: float
    """Spread of the reference runs at this GBS."""
    reference: float
    """RCP mean the checker scales a faster run's score to."""
    kind: str
    """'rcp' (at or between RCPs) or 'below' (under the smallest RCP: the RCPs' trend)."""


def _interp(x: float, x0: float, x1: float, y0: float, y1: float) -> float:
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@cache
def convergence(gbs: int, precision: str = "bf16", benchmark: str = "llama31_405b") -> Convergence:
    pts = rcp_points(benchmark)
    factor = ASSUMED.nvfp4_samples_factor if precision == "nvfp4" else 1.0
    if gbs > pts[-1].gbs:
        raise ValueError(f"GBS {gbs} exceeds {pts[-1].gbs}, the largest batch with a reference "
                         "convergence point: no submission is possible")
    if gbs < pts[0].gbs:
        lo = pts[0]
        mean = lo.mean
        if len(pts) > 1:
            mean = _interp(gbs, lo.gbs, pts[1].gbs, lo.mean, pts[1].mean)
        return Convergence(gbs, mean * factor, lo.stdev, lo.mean, "below")
    for a, b in zip(pts, pts[1:] or pts):
        if a.gbs <= gbs <= b.gbs:
            if a.gbs == b.gbs:
                mean, sd = a.mean, a.stdev
            else:
                mean = _interp(gbs, a.gbs, b.gbs, a.mean, b.mean)
                sd = _interp(gbs, a.gbs, b.gbs, a.stdev, b.stdev)
            return Convergence(gbs, mean * factor, sd, mean, "rcp")
    raise AssertionError("unreachable")


def samples_to_converge(gbs: int, precision: str = "bf16", benchmark: str = "llama31_405b") -> float:
    return convergence(gbs, precision, benchmark).samples


@dataclass(frozen=True, slots=True)
class Schedule:
    gbs: int
    samples_to_converge: float
    """Samples the run is expected to need."""
    steps: int
    """Training steps until the evaluation that converges."""
    evaluations: int
    """Evaluations run up to and including that one."""
    eval_interval_steps: int
    first_eval_step: int
    score_scale: float
    """The checker's score scaling (>= 1) for a run that converged in fewer samples than the
    RCP mean it is compared with."""

    @property
    def samples(self) -> int:
        return self.steps * self.gbs


@cache
def schedule(rules: BenchmarkRules, gbs: int, precision: str = "bf16",
             samples: float | None = None) -> Schedule:
    """Steps and evaluations of a run at `gbs` that converges after `samples` samples (default:
    the expected samples)."""
    hp = hparams(rules, gbs)
    conv = convergence(gbs, precision, rules.name)
    need_samples = conv.samples if samples is None else samples
    need = math.ceil(need_samples / gbs)
    k = max(0, math.ceil((need - hp.first_eval_step) / hp.eval_interval_steps))
    steps = hp.first_eval_step + k * hp.eval_interval_steps
    return Schedule(gbs=gbs, samples_to_converge=need_samples, steps=steps, evaluations=k + 1,
                    eval_interval_steps=hp.eval_interval_steps, first_eval_step=hp.first_eval_step,
                    score_scale=max(1.0, conv.reference / (steps * gbs)))
