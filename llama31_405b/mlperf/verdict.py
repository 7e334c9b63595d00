"""THE answer to "did this run converge, and when": one function, `convergence(run)`, used by
`compliance check`, `launch check-log` (run_and_time.sh's outcome line), `report` (its table and
olympic score), `submission package` (its refusals and its own score) and the RCP check.

A run converged when BOTH checkers that decide a submission would count it:

- the compliance checker (mlperf-logging 4.1.68, `compliance_checker/training_6.0.0/
  closed_llama31_405b.yaml`, key eval_accuracy, `ATLEAST_ONE_CHECK: (v['value'] <= 5.6) and
  v['value'] > 0.0`; the project's `compliance/tiny_llama31.yaml` carries the same check): at least
  one evaluation at or below the target. Its `common.yaml` only asks that run_stop carries a
  `status` ("status can also be aborted, but not allowing it here for now"), so it passes an
  aborted run that once evaluated below the target;
- the RCP checker (`rcp_checker.read_submission_file`): a run converged only when its run_stop
  status is "success", and its samples to converge are the `samples_count` of the LAST
  eval_accuracy before that run_stop ("Epochs to converge is the last epochs value on
  eval_accuracy line before run_stop").

Its time to train is the result summarizer's (`result_summarizer._query_run_start_stop`):
run_stop's time minus run_start's, in minutes. The summarizer scores only logs that pass the
compliance checker (`_read_result_file`), so a successful run_stop without an evaluation at the
target, which the compliance checker rejects, is never a success here either ("not converged:
best 5.61 > 5.6"), and an aborted run is never one even when the compliance checker passes it.

(`mlperf.log.RunLog.convergence` calls this module; it imports nothing from there.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .log import RunLog


@dataclass(frozen=True, slots=True)
class Convergence:
    converged: bool
    status: str | None
    """run_stop's status ('success', 'aborted'); None without run_stop."""
    words: str
    """How the run ended, for people: 'converged', 'aborted (<reason>)', 'no run_stop',
    'not converged: best 5.61 > 5.6', ..."""
    minutes: float | None
    """Time to train (run_start -> run_stop) when converged, else None."""
    samples: float | None
    """Samples to converge (the RCP checker's) when converged, else None."""
    best: float | None
    """Lowest evaluation before run_stop (None: no evaluation)."""
    target: float | None

    def describe(self) -> str:
        """One line: 'converged: 5.58 <= 5.6, 235.864 min, 4,773,888 samples' or the words."""
        if not self.converged:
            return self.words
        return (f"converged: {self.best:g} <= {self.target:g}, {self.minutes:.3f} min, "
                f"{self.samples:,.0f} samples")


def target_of(run: RunLog) -> float | None:
    """The benchmark's target (config.rules), else a logged target_accuracy, else None."""
    from ..config.rules import BENCHMARKS
    if run.benchmark in BENCHMARKS:
        return float(BENCHMARKS[run.benchmark].target)
    logged = run.value("target_accuracy")
    try:
        return None if logged is None else float(logged)
    except (TypeError, ValueError):
        return None


def convergence(run: RunLog, target: float | None = None) -> Convergence:
    """Did `run` converge, and when (module docstring). target: default `target_of(run)`."""
    target = target_of(run) if target is None else target
    start = stop = None
    evals: list[tuple[float, float]] = []      # (samples_count, value) before run_stop
    for e in run.events:
        if e.key == "run_start":
            start = e
        elif e.key == "eval_accuracy" and "samples_count" in e.metadata:
            try:
                evals.append((float(e.metadata["samples_count"]), float(e.value)))
            except (TypeError, ValueError):
                continue
        elif e.key == "run_stop":
            stop = e
            break
    best = min((v for _, v in evals), default=None)

    def no(words: str, status=None) -> Convergence:
        return Convergence(False, status, words, None, None, best, target)

    if stop is None:
        return no("no run_stop")
    status = stop.metadata.get("status")
    if status != "success":
        reason = str(stop.metadata.get("reason", ""))
        return no(f"{status} ({reason})" if reason else str(status), status)
    if start is None:
        return no("not converged: no run_start before run_stop", status)
    if target is None:
        return no(f"not converged: no target known for benchmark {run.benchmark!r}", status)
    if not any(0.0 < v <= target for _, v in evals):
        return no(f"not converged: best {best:g} > {target:g}" if best is not None else
                  "not converged: no evaluation before run_stop", status)
    minutes = (stop.time_ms - start.time_ms) / 60_000.0
    return Convergence(True, status, "converged", minutes, evals[-1][0], best, target)

