"""The verdict on one finished run: the MLPerf compliance checker on its log, and its run_stop
status. run_and_time.sh counts a run as successful only when both pass.

The checker is the project's `compliance check` command when it is installed (llama31_405b.cli
COMMANDS), otherwise mlperf-logging's checker (ruleset 6.0.0) run directly, with the project's
rules file for benchmarks other than llama31_405b (the tiny CPU benchmark).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

RULESET = "6.0.0"
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Verdict:
    log: str
    compliant: bool
    status: str | None
    """run_stop status in the log ("success", "aborted"), None when the log has no run_stop."""
    detail: str

    @property
    def success(self) -> bool:
        return self.compliant and self.status == "success"


def run_status(log: Path) -> str | None:
    """The status of the last run_stop event of an MLPerf log (lines may carry `srun -l`
    prefixes); None without one."""
    status = None
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        at = line.find(":::MLLOG ")
        if at < 0 or '"run_stop"' not in line:
            continue
        try:
            event = json.loads(line[at + len(":::MLLOG "):])
        except json.JSONDecodeError:
            continue
        if event.get("key") == "run_stop":
            status = str(event.get("metadata", {}).get("status"))
    return status


def rules_file(benchmark: str) -> Path | None:
    """The checker's --config for `benchmark`: None for llama31_405b (the checker's own chain),
    the project's rules file under compliance/ otherwise."""
    if benchmark == "llama31_405b":
        return None
    root = REPO / "compliance"
    candidates = [root / f"{benchmark}.yaml", root / benchmark / "common.yaml",
                  *sorted(root.glob(f"**/*{benchmark}*.yaml"))]
    for c in candidates:
        if c.is_file():
            return c
    raise FileNotFoundError(
        f"no compliance rules for benchmark {benchmark!r}: expected {candidates[0]} or "
        f"{candidates[1]} (the tiny rules file of the compliance work)")


def _project_command_available() -> bool:
    from ..cli import COMMANDS
    return "compliance" in COMMANDS


def check_log(log: Path, benchmark: str, report_dir: Path | None = None) -> Verdict:
    """Check one log; the checker's own output goes to `report_dir`/<log name>.compliance.log
    (a temporary directory when None: never next to a log that may be read-only)."""
    if report_dir is None:
        with tempfile.TemporaryDirectory() as tmp:
            return check_log(log, benchmark, Path(tmp))
    log = Path(log)
    if not log.is_file():
        return Verdict(str(log), False, None, "log file missing: the run wrote no MLPerf log")
    if _project_command_available():
        cmd = [sys.executable, "-m", "llama31_405b", "compliance", "check", str(log)]
    else:
        rules = rules_file(benchmark)
        cmd = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
               "--ruleset", RULESET, "--log_output", str(Path(report_dir) / f"{log.stem}.compliance.log")]
        if rules is not None:
            cmd += ["--config", str(rules)]
        cmd.append(str(log))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    problems = [ln.strip() for ln in out if ln.strip()
                and not ln.startswith(("INFO", "** Logging output"))]
    detail = "; ".join(problems[-5:]) if proc.returncode else "compliance checker passed"
    return Verdict(str(log), proc.returncode == 0, run_status(log), detail)
