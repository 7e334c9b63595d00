"""The real MLPerf compliance checker (mlperf_logging.compliance_checker), run in-process, with the
ruleset this project submits under (`RULESET`, written once in `config.rules` beside the rules it
mirrors, and passed to every checker call from here).

`check_log(path)` runs the checker exactly as `python -m mlperf_logging.compliance_checker --usage
training --ruleset R [--config FILE] LOG` does (same ComplianceChecker, same rule files) and keeps
its words: the failure messages, the warnings and the list of rule files that ran. Rules:
- llama31_405b logs: the package's `training_<R>/common.yaml` chain (common -> closed_common ->
  closed_llama31_405b), ruleset `RULESET` by default (the checker's own default, 6.1.0, has
  dropped the benchmark);
- tiny_llama31 logs: the project's `compliance/tiny_llama31.yaml` (closed division) or
  `compliance/tiny_llama31_open.yaml` (open division; see `tiny_rules`), chosen by the log's
  submission_benchmark and submission_division (`launch check-log`: by the config's).

The checker resolves `--config` and every enqueued rule file with
`os.path.join(<compliance_checker package dir>, path)`: package-relative names resolve inside
mlperf_logging, an absolute path resolves to itself, and a path relative to the current directory
does NOT work (`--config compliance/x.yaml` looks for x.yaml inside site-packages). The project's
rule file is therefore always passed as an absolute path.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..config.rules import RULESET
from .log import TOKEN, LogError, LogEvent, parse_line, read_events

REPO = Path(__file__).resolve().parents[2]
COMPLIANCE_DIR = REPO / "compliance"
USAGE = "training"

# Project benchmarks that are not MLPerf benchmarks: their closed-division rule file in
# compliance/; the open division's is `<stem>_open.yaml` (`project_rules_name`).
PROJECT_RULES = {"tiny_llama31": "tiny_llama31.yaml"}
DIVISIONS = ("closed", "open")


@dataclass(slots=True)
class CheckResult:
    path: str
    ok: bool
    ruleset: str
    config: str
    """The rule file given to the checker (package-relative or absolute)."""
    rule_files: list[str] = field(default_factory=list)
    """Every rule file the checker ran ("Compliance checks: ..." lines)."""
    errors: list[str] = field(default_factory=list)
    """The checker's failure messages, verbatim."""
    warnings: list[str] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    """Malformed lines with file and 1-based line (the project's reader)."""
    lines: list[int] = field(default_factory=list)
    """File line of each MLLOG line (filled when the file may not outlive the result)."""

    def verdict(self) -> str:
        rules = ", ".join(Path(r).name if Path(r).is_absolute() else r for r in self.rule_files)
        if self.ok:
            extra = f"; {len(self.warnings)} warning(s)" if self.warnings else ""
            return f"PASS {self.path} (ruleset {self.ruleset}: {rules}{extra})"
        problems = self.summary() or ["failed"]
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return f"FAIL {self.path} (ruleset {self.ruleset}: {rules}): {problems[0]}{more}"

    def summary(self, *, locate: bool = True) -> list[str]:
        """One line per problem in the checker's words: what failed, the logged value and the
        failed test. locate: translate the checker's line index into the file's 1-based line."""
        lines = (self.lines or mllog_line_numbers(self.path)) if self.errors and locate else []
        out = list(self.parse_errors)
        for msg in self.errors:
            parts = msg.strip().splitlines()
            head = parts[0] if parts else msg
            m = re.search(r" in line (\d+)", head)
            if m:
                idx = int(m.group(1))
                where = f" at {self.path}:{lines[idx]}" if idx < len(lines) else ""
                head = head.replace(m.group(0), where).rstrip(":")
            logged = next((p for p in parts[1:3] if TOKEN in p), None)
            if logged:
                got = parse_line(logged, self.path, 0)
                if isinstance(got, LogEvent):
                    head += f" (logged value {got.value!r})"
            test = next((p for p in parts[1:] if p.startswith("failed test:")), "")
            out.append(f"{head}; {test}" if test else head)
        return out

    def details(self) -> str:
        return "\n".join([*self.parse_errors, *self.errors, *(f"warning: {w}" for w in self.warnings)])

    def report(self) -> str:
        """The whole verdict as text (what `launch check-log --report-dir` keeps): the verdict
        line, the rule files that ran, every problem located in the file, then the checker's
        own messages and warnings verbatim."""
        out = [self.verdict(), f"ruleset {self.ruleset}, rule file {self.config or '-'}",
               "rule files run: " + (", ".join(self.rule_files) or "none")]
        if not self.ok:
            out += ["problems:", *(f"  {p}" for p in self.summary())]
        if self.errors or self.warnings:
            out += ["checker messages:", *(f"  {ln}" for ln in self.details().splitlines())]
        return "\n".join(out) + "\n"


def project_rules_name(benchmark: str, division: str = "closed") -> str:
    """File name of a project benchmark's rules for `division` (closed or open)."""
    name = PROJECT_RULES[benchmark]
    return name if division != "open" else name.removesuffix(".yaml") + "_open.yaml"


def project_rules_path(benchmark: str, division: str = "closed") -> Path:
    """Absolute path of a project benchmark's rule file; LogError when it is missing."""
    path = COMPLIANCE_DIR / project_rules_name(benchmark, division)
    if not path.is_file():
        raise LogError(f"{path}: rules file for {benchmark} ({division} division) missing; "
                       "regenerate it with `python -m llama31_405b compliance tiny-rules --write`")
    return path


def config_for(benchmark: str | None, ruleset: str = RULESET, division: str | None = None) -> str:
    """The rule file the checker starts from for a log of `benchmark` in `division` (a project
    benchmark's file depends on it; the MLPerf chain follows the log's submission_division)."""
    if benchmark in PROJECT_RULES:
        return str(project_rules_path(benchmark, division or "closed"))
    return f"{USAGE}_{ruleset}/common.yaml"


def mllog_line_numbers(path: str | Path) -> list[int]:
    """1-based file line of each line holding the MLLOG token: the checker numbers its messages
    by the position among these lines (from 0)."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return []
    return [i for i, b in enumerate(raw.decode("latin-1").splitlines(), start=1) if TOKEN in b]


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def run_checker(path: str | Path, config: str, ruleset: str = RULESET) -> CheckResult:
    """Run mlperf_logging's ComplianceChecker on one file with one starting rule file."""
    from mlperf_logging.compliance_checker import mlp_compliance

    path = str(path)
    root = logging.getLogger()
    cap = _Capture()
    old_level = root.level
    old_handlers = root.handlers[:]
    # the checker logs through the root logger; keep its lines off the user's terminal
    for h in old_handlers:
        root.removeHandler(h)
    root.addHandler(cap)
    root.setLevel(logging.INFO)
    mlp_compliance.enqueued_configs.clear()   # module-global queue; a crashed run may leave entries
    checker = mlp_compliance.make_checker(USAGE, ruleset, False, False)
    crash = None
    try:
        checker.check_file(path, config)
    except Exception as e:  # the checker crashes on some inputs (a missing rule file, a bad key)
        crash = f"compliance checker crashed: {type(e).__name__}: {e}"
    finally:
        mlp_compliance.enqueued_configs.clear()
        root.removeHandler(cap)
        for h in old_handlers:
            root.addHandler(h)
        root.setLevel(old_level)
    rule_files = [str(r.args[0]) for r in cap.records
                  if r.msg.strip().startswith("Compliance checks:") and isinstance(r.args, tuple)
                  and r.args]
    errors = [*checker.overwritable.values(), *checker.not_overwritable]
    if crash:
        errors.append(crash)
    res = CheckResult(path=path, ok=not errors, ruleset=ruleset, config=config,
                      rule_files=rule_files, errors=errors, warnings=list(checker.warnings.values()))
    return res


def check_log(path: str | Path, *, ruleset: str = RULESET,
              config: str | None = None) -> CheckResult:
    """Check one finished log: our reader first (file:line of malformed lines), then the checker
    with the rules of the log's benchmark (or `config`)."""
    path = str(path)
    try:
        events, problems = read_events(path)
    except LogError as e:
        return CheckResult(path=path, ok=False, ruleset=ruleset, config=config or "",
                           parse_errors=[str(e)])
    bench = next((str(e.value) for e in events if e.key == "submission_benchmark"), None)
    division = next((str(e.value) for e in events if e.key == "submission_division"), None)
    try:
        cfg_file = config or config_for(bench, ruleset, division)
    except LogError as e:
        return CheckResult(path=path, ok=False, ruleset=ruleset, config="", errors=[str(e)])
    res = run_checker(path, cfg_file, ruleset)
    res.parse_errors = [str(p) for p in problems]
    if not events:
        res.parse_errors.append(f"{path}: no ':::MLLOG ' lines: not an MLPerf log")
    res.ok = res.ok and not res.parse_errors
    return res


def judge(res, path=None) -> tuple[bool, str, object]:
    """A compliance checker result (`mlperf.checker.CheckResult`) and the log's convergence as
    one verdict: (ok, line, convergence). ok only when the rules pass AND the run converged; the
    line is the checker's verdict followed by the convergence in words."""
    from .log import load_run
    from .verdict import convergence
    try:
        conv = convergence(load_run(path or res.path, strict=False))
    except LogError:
        conv = None
    line = res.verdict()
    if conv is None:
        return False, line, None
    if res.ok and not conv.converged:
        return False, "FAIL" + line[len("PASS"):] + f"; the rules pass, but {conv.words}", conv
    if not res.ok and conv.converged:
        # no "converged: 5.58 <= 5.6" beside a failed rule (an accuracy rule of another
        # benchmark, for one): a log the rules refuse counts for nothing
        return False, f"{line}; not counted as converged: the log fails the rules above", conv
    return res.ok and conv.converged, f"{line}; {conv.describe()}", conv
