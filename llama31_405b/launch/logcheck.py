"""The verdict on one finished run: the MLPerf compliance checker on its log (in-process, with the
rules of the config's benchmark and division: `mlperf.checker`), and how the run ended, from its
run_stop. The log is read by the project's one reader (`mlperf.log`): a file that is not one run's
log (two runs, a damaged line) fails with the reader's message, file and line, as in `compliance
check`, `report` and `submission package`; here it is the run's FAIL line (exit 1, or 4 when the
log also lacks run_stop), not an error, since run_and_time.sh keeps that line as the outcome.
run_and_time.sh counts a run as successful only when both pass, and reports the outcome of every
run: success, aborted (with the logged reason), or no run_stop (the run was killed).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ..mlperf.checker import RULESET, CheckResult, check_log as run_compliance, config_for
from ..mlperf.log import LogError, load_run

# `launch check-log` exit codes, shared with run_and_time.sh (see its header)
EXIT_OK, EXIT_FAILED, EXIT_NO_RUN_STOP = 0, 1, 4


@dataclass(frozen=True, slots=True)
class Verdict:
    log: str
    compliant: bool
    status: str | None
    """run_stop status in the log ("success", "aborted"), None when the log has no run_stop."""
    outcome: str
    """'success', 'aborted (<reason>)' or 'no run_stop'."""
    detail: str
    """The checker's first problem and a count of the others; '' when compliant."""
    converged: bool = False
    """mlperf.verdict: run_stop success after an evaluation at the target."""
    when: str = ""
    """The convergence in words ('converged: 5.58 <= 5.6, 235.864 min, ...')."""
    refused: bool = False
    """The reader refused the file (two runs, a damaged line): no run_stop of it is reported."""

    @property
    def success(self) -> bool:
        return self.compliant and self.converged

    def line(self, require_success: bool) -> str:
        ok = self.success if require_success else self.compliant
        if self.refused:      # what a refused file says about run_stop is not this run's
            return (f"FAIL {self.log}: NOT compliant, not one run's log (the reader refused it)"
                    f" -- {self.detail}")
        return (f"{'PASS' if ok else 'FAIL'} {self.log}: "
                f"{'compliant' if self.compliant else 'NOT compliant'}, run_stop status "
                f"{self.outcome if self.status else 'missing'}"
                # converged only by the rules that passed: no "converged" beside a failed rule
                + (f", {self.when}" if self.when and self.status == "success"
                   and (self.compliant or not self.converged) else "")
                + ("" if self.compliant else f" -- {self.detail}"))


def report_path(report_dir: str | Path, log: str | Path) -> Path:
    return Path(report_dir) / f"{Path(log).stem}.compliance.log"


def check_log(log: str | Path, benchmark: str, report_dir: str | Path | None = None,
              ruleset: str = RULESET, division: str = "closed") -> Verdict:
    """Check one log with the rules of `benchmark` in `division` (the config's). report_dir: the
    checker's whole verdict is kept there as <log stem>.compliance.log (next to an earlier one,
    kept: <log stem>.compliance-N.log, printed)."""
    log = Path(log)
    res: CheckResult | None = None
    if not log.is_file():
        v = Verdict(str(log), False, None, "no run_stop",
                    "log file missing: the run wrote no MLPerf log")
    else:
        rules = config_for(benchmark, ruleset, division)
        res = run_compliance(log, ruleset=ruleset, config=rules)
        try:
            run = load_run(log, strict=False)
            bench = run.first("submission_benchmark")
            if bench is not None and bench.value != benchmark:
                res.parse_errors.insert(0, (
                    f"{log}:{bench.lineno}: submission_benchmark {bench.value!r}, but the config "
                    f"says run.benchmark = {benchmark!r}: the log of another benchmark's run "
                    f"(checked with the rules of {bench.value!r}, as the log names it)"
                    if config_for(bench.value, ruleset, division) == rules else
                    f"{log}:{bench.lineno}: submission_benchmark {bench.value!r}, but the config "
                    f"says run.benchmark = {benchmark!r}: the log of another benchmark's run"))
                res.ok = False
            logged = run.first("submission_division")
            if logged is not None and logged.value != division:
                res.parse_errors.insert(0, (
                    f"{log}:{logged.lineno}: submission_division {logged.value!r}, but the config "
                    f"says run.division = {division!r}: the log of another config's run"))
                res.ok = False
            conv = run.convergence()      # mlperf.verdict: the one owner of "converged"
            status, converged, when = run.status, conv.converged, conv.describe()
            outcome = ("success" if status == "success" else conv.words)
            refused = bool(run.problems)
            if refused:        # the reader's problem (in the detail) says more than a convergence
                converged, when = False, ""       # read from a damaged or doubled file
                outcome = "not read: the reader refused the file"
        except LogError:
            status, outcome, converged, when, refused = None, "no run_stop", False, "", False
        problems = res.summary()
        detail = "" if res.ok else (problems[0] if problems else "failed") + (
            f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
        v = Verdict(str(log), res.ok, status, outcome, detail, converged, when, refused)
    if report_dir is not None:
        Path(report_dir).mkdir(parents=True, exist_ok=True)
        text = res.report() if res is not None else f"FAIL {log}: {v.detail}\n"
        # an earlier verdict of this name is kept: the next free <stem>.compliance-N.log, named
        from ..outputs import create_exclusive
        default = report_path(report_dir, log)
        got = create_exclusive(default, text + f"outcome: {v.outcome}" + (
            f", {v.when}" if v.when and v.status == "success"
            and (v.compliant or not v.converged) else "") + "\n", unique=True)
        if got != default:
            print(f"note: {default} exists (an earlier verdict, kept); this verdict: {got}",
                  file=sys.stderr)
    return v


def exit_code(verdicts: list[Verdict], require_success: bool) -> int:
    """EXIT_NO_RUN_STOP when a log lacks run_stop (killed), else EXIT_FAILED when one fails."""
    if any(v.status is None for v in verdicts):
        return EXIT_NO_RUN_STOP
    if any(not (v.success if require_success else v.compliant) for v in verdicts):
        return EXIT_FAILED
    return EXIT_OK
