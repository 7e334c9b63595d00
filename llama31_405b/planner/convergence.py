"""Samples to converge vs GBS, and the steps and evaluations the benchmark then runs.

From the reference convergence points (FACTS.md section 3, `BenchmarkRules.rcp_gbs`): GBS 1152 ->
313,344 samples, 2304 -> 368,640, 4608 -> 493,056, linear in between. Below 1152 the checker
compares with the 1152 point and accepts a run that is not faster, so the planner uses 313,344
(a smaller batch would need a new RCP to claim fewer samples). Above 4608 there is no RCP: such a
GBS cannot be submitted. A run stops at the first evaluation that reaches the target, so the
steps are the samples rounded up to the evaluation schedule of `config.rules.hparams`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..config.rules import BenchmarkRules, hparams

# Reference convergence points of llama31_405b (ruleset 6.0.0): GBS -> mean samples to converge.
RCP_SAMPLES = {1152: 313_344, 2304: 368_640, 4608: 493_056}


def samples_to_converge(gbs: int, rcp: dict[int, int] = RCP_SAMPLES) -> float:
    pts = sorted(rcp.items())
    if gbs > pts[-1][0]:
        raise ValueError(f"GBS {gbs} exceeds {pts[-1][0]}, the largest batch with a reference "
                         "convergence point: no submission is possible")
    if gbs <= pts[0][0]:
        return float(pts[0][1])
    for (g0, s0), (g1, s1) in zip(pts, pts[1:]):
        if gbs <= g1:
            return s0 + (s1 - s0) * (gbs - g0) / (g1 - g0)
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class Schedule:
    gbs: int
    samples_to_converge: float
    """Samples the reference convergence points predict."""
    steps: int
    """Training steps until the evaluation that converges."""
    evaluations: int
    """Evaluations run up to and including that one."""
    eval_interval_steps: int
    first_eval_step: int

    @property
    def samples(self) -> int:
        return self.steps * self.gbs


def schedule(rules: BenchmarkRules, gbs: int, rcp: dict[int, int] = RCP_SAMPLES) -> Schedule:
    hp = hparams(rules, gbs)
    need = math.ceil(samples_to_converge(gbs, rcp) / gbs)
    k = max(0, math.ceil((need - hp.first_eval_step) / hp.eval_interval_steps))
    steps = hp.first_eval_step + k * hp.eval_interval_steps
    return Schedule(gbs=gbs, samples_to_converge=samples_to_converge(gbs, rcp), steps=steps,
                    evaluations=k + 1, eval_interval_steps=hp.eval_interval_steps,
                    first_eval_step=hp.first_eval_step)
