"""The MLPerf log line format, and THE reader of a result file: every `:::MLLOG {json}` line,
and the file and line of everything that keeps the file from being one run's log.

`compliance check`, `report`, `submission package` and `launch check-log` all read a result file
through `read_events`, so they refuse the same files with the same message (`LogProblem`:
`FILE:LINE: what is wrong`). The rules (docs/compliance.md, "Reading a result file"):

- An event is a line holding `:::MLLOG ` followed by a JSON object with key, time_ms, value and
  metadata. Anything before the marker is ignored, as the checkers do, so `srun -l` prefixes
  ("  0: :::MLLOG ...") and timestamps from other loggers are fine.
- A line with the marker whose JSON does not parse (a truncated last line, garbage bytes, a
  missing field) is a problem; the checkers would only say "Log lines had parsing errors" or
  crash.
- A damaged event: a line WITHOUT the marker that still holds `MLLOG` or one of the event's own
  JSON keys (`"namespace":`, `"event_type":`, `"time_ms":`) is where an event stood whose marker
  was overwritten or cut. The checkers skip such a line silently (it is not an MLLOG line to
  them), which can drop the evaluation that converged; here it is a problem. Other lines (a
  console's output, blank lines) are skipped.
- One file, one run: a second `run_start`, or any event after the first `run_stop`, is a problem
  (two runs appended to one file, or a writer that went on after the run ended). The checkers
  would fail on some later rule (`init_start` of the second run) or count the file as one run.

`RunLog` answers the questions the package, the RCP check, the report, `launch check-log` and
`demo` ask of one run: benchmark, GBS, seed, status (and why it stopped), time to train, the
evaluations and the step times. `format_line` is the one writer of a line (see `writer`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOKEN = ":::MLLOG "
_REQUIRED = ("key", "time_ms", "value", "metadata")
# what still shows on a line where an event stood after its marker was damaged
_EVENT_TRACES = (b"MLLOG", b'"namespace":', b'"event_type":', b'"time_ms":')


@dataclass(frozen=True, slots=True)
class LogEvent:
    key: str
    value: Any
    metadata: dict
    time_ms: float
    lineno: int
    """1-based line number in the file."""
    event_type: str = "POINT_IN_TIME"


@dataclass(frozen=True, slots=True)
class LogProblem:
    path: str
    lineno: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.lineno}: {self.message}"


class LogError(ValueError):
    """A log cannot be used; the message names the file (and line) and what is wrong."""


def event_type_for(key: str) -> str:
    if key.endswith("_start"):
        return "INTERVAL_START"
    if key.endswith("_stop"):
        return "INTERVAL_END"
    return "POINT_IN_TIME"


def format_line(key: str, value: Any, *, time_ms: float, metadata: dict | None = None,
                event_type: str | None = None) -> str:
    """One MLLOG line as mlperf_logging.mllog writes it (floats keep their exact repr)."""
    record = {"namespace": "", "time_ms": time_ms, "event_type": event_type or event_type_for(key),
              "key": key, "value": value, "metadata": metadata or {}}
    return TOKEN + json.dumps(record)


def parse_line(text: str, path: str, lineno: int) -> LogEvent | LogProblem | None:
    """Parse one text line: an event, a problem, or None when it is not an MLLOG line."""
    pos = text.find(TOKEN)
    if pos < 0:
        return None
    payload = text[pos + len(TOKEN):].strip()
    try:
        rec = json.loads(payload)
    except json.JSONDecodeError as e:
        cut = e.pos >= len(payload) - 1 or e.msg.startswith("Unterminated string")
        what = "truncated" if cut else "malformed"
        # json's messages may end in "at" ("Unterminated string starting at")
        return LogProblem(path, lineno, f"{what} MLLOG line ({e.msg.removesuffix(' at')} at "
                                        f"column {e.pos + 1}): {payload[:80]!r}")
    if not isinstance(rec, dict):
        return LogProblem(path, lineno, "MLLOG payload is not a JSON object")
    missing = [k for k in _REQUIRED if k not in rec]
    if missing:
        return LogProblem(path, lineno, f"MLLOG record lacks {', '.join(missing)}")
    if not isinstance(rec["metadata"], dict):
        return LogProblem(path, lineno, "MLLOG metadata is not a JSON object")
    try:
        t = float(rec["time_ms"])
    except (TypeError, ValueError):
        return LogProblem(path, lineno, f"time_ms {rec['time_ms']!r} is not a number")
    return LogEvent(key=str(rec["key"]), value=rec["value"], metadata=rec["metadata"], time_ms=t,
                    lineno=lineno, event_type=str(rec.get("event_type", event_type_for(rec["key"]))))


def read_events(path: str | Path) -> tuple[list[LogEvent], list[LogProblem]]:
    """All MLLOG events of a file and the problems found, each with its 1-based line number."""
    path = str(path)
    events: list[LogEvent] = []
    problems: list[LogProblem] = []
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise LogError(f"{path}: cannot read: {e.strerror}") from None
    for lineno, bline in enumerate(raw.splitlines(), start=1):
        if TOKEN.encode() not in bline:
            trace = next((t.decode() for t in _EVENT_TRACES if t in bline), None)
            if trace:
                problems.append(LogProblem(
                    path, lineno, f"damaged MLLOG line: {trace} but no ':::MLLOG ' marker (an "
                                  f"event stood here; the checkers would skip it): {bline[:60]!r}"))
            continue
        try:
            text = bline.decode("utf-8")
        except UnicodeDecodeError as e:
            problems.append(LogProblem(path, lineno, f"garbage bytes (not UTF-8) at byte {e.start}"
                                                     f" of an MLLOG line: {bline[:60]!r}"))
            continue
        if "\x00" in text:
            problems.append(LogProblem(path, lineno, "NUL bytes in an MLLOG line"))
            continue
        got = parse_line(text, path, lineno)
        if isinstance(got, LogEvent):
            events.append(got)
        elif isinstance(got, LogProblem):
            problems.append(got)
    problems += run_problems(path, events)
    problems.sort(key=lambda p: p.lineno)
    return events, problems


def run_problems(path: str, events: list[LogEvent]) -> list[LogProblem]:
    """One file, one run: a second run_start, or an event after the first run_stop."""
    starts = [e for e in events if e.key == "run_start"]
    stop = next((e for e in events if e.key == "run_stop"), None)
    after = [e for e in events if stop is not None and e.lineno > stop.lineno]
    out = []
    if len(starts) > 1:
        second = starts[1]
        then = (f"; the first run's run_stop is at line {stop.lineno}"
                if stop is not None and stop.lineno < second.lineno else "")
        out.append(LogProblem(path, second.lineno, (
            f"a second run_start (the first is at line {starts[0].lineno}{then}): this file "
            f"holds {len(starts)} runs, a result file holds one; give each run its own file")))
    elif after and stop is not None:   # (events after run_stop imply one)
        out.append(LogProblem(path, after[0].lineno, (
            f"{after[0].key!r} after run_stop (line {stop.lineno}): nothing follows run_stop in a "
            f"result file ({len(after)} event(s) do here)")))
    return out


def log_events(path: str | Path) -> list[LogEvent]:
    """The well-formed events of a log that may still be growing: [] while the file does not
    exist, malformed lines (a line being written) left out."""
    try:
        return read_events(path)[0]
    except LogError:
        return []


@dataclass(slots=True)
class RunLog:
    """One run's MLLOG events and what follows from them."""
    path: str
    events: list[LogEvent]
    problems: list[LogProblem] = field(default_factory=list)

    def values(self, key: str) -> list[Any]:
        return [e.value for e in self.events if e.key == key]

    def first(self, key: str) -> LogEvent | None:
        return next((e for e in self.events if e.key == key), None)

    def value(self, key: str, default: Any = None) -> Any:
        e = self.first(key)
        return default if e is None else e.value

    @property
    def benchmark(self) -> str | None:
        return self.value("submission_benchmark")

    @property
    def gbs(self) -> int | None:
        v = self.value("global_batch_size")
        return None if v is None else int(v)

    @property
    def seed(self) -> Any:
        return self.value("seed")

    @property
    def status(self) -> str | None:
        """run_stop's metadata status ('success', 'aborted'), or None without run_stop."""
        e = self.first("run_stop")
        return None if e is None else e.metadata.get("status")

    def outcome(self) -> str:
        """How the run ended, in words: 'success', 'aborted (<reason>)', 'no run_stop' (the
        process was killed before it could log one, or the log was cut), or, for a run_stop
        success that the checkers would not count, 'not converged: best 5.61 > 5.6'."""
        v = self.convergence()
        return "success" if v.converged else v.words

    def convergence(self):
        """Did the run converge, and when: `mlperf.verdict.convergence`, the one owner."""
        from .verdict import convergence
        return convergence(self)

    @property
    def converged(self) -> bool:
        return self.convergence().converged

    @property
    def run_start_ms(self) -> float | None:
        e = self.first("run_start")
        return None if e is None else e.time_ms

    @property
    def run_stop_ms(self) -> float | None:
        e = self.first("run_stop")
        return None if e is None else e.time_ms

    @property
    def time_to_train_min(self) -> float | None:
        """run_start -> run_stop in minutes (the MLPerf score of one run)."""
        if self.run_start_ms is None or self.run_stop_ms is None:
            return None
        return (self.run_stop_ms - self.run_start_ms) / 60_000.0

    @property
    def evals(self) -> list[tuple[float, float]]:
        """(samples_count, eval_accuracy) of every evaluation, in log order."""
        return [(float(e.metadata["samples_count"]), float(e.value)) for e in self.events
                if e.key == "eval_accuracy" and "samples_count" in e.metadata]

    @property
    def samples_to_converge(self) -> float | None:
        """The RCP checker's measure: samples_count of the last evaluation before a successful
        run_stop; None when the run did not converge (`mlperf.verdict`)."""
        return self.convergence().samples

    def step_times(self) -> tuple[str, list[tuple[float, float]]]:
        """(source, [(samples, seconds per step)]): per-step `tracked_stats` train_step_time when
        the log has them, else the mean step time of each block (block wall time divided by the
        steps between consecutive evaluations)."""
        tracked = [(float(e.metadata["samples_count"]), float(e.value["train_step_time"]))
                   for e in self.events if e.key == "tracked_stats" and isinstance(e.value, dict)
                   and "train_step_time" in e.value and "samples_count" in e.metadata]
        per_step = [(float(e.metadata["samples_count"]), float(e.value["train_step_time"]))
                    for e in self.events if e.key == "tracked_stats" and isinstance(e.value, dict)
                    and "train_step_time" in e.value and "samples_count" in e.metadata
                    and "step" in e.metadata]
        if per_step:   # per-block summaries (no step; samples_count = block length) left out
            tracked = per_step
        if tracked:
            return "tracked_stats train_step_time", sorted(tracked)
        gbs = self.gbs
        if not gbs:
            return "none", []
        out: list[tuple[float, float]] = []
        start = None
        prev_samples = 0.0
        evals = iter(self.evals)
        for e in self.events:
            if e.key == "block_start":
                start = e.time_ms
            elif e.key == "block_stop" and start is not None:
                nxt = next(evals, None)
                if nxt is None:
                    break
                steps = (nxt[0] - prev_samples) / gbs
                if steps > 0:
                    out.append((nxt[0], (e.time_ms - start) / 1000.0 / steps))
                prev_samples, start = nxt[0], None
        return "block timing", out


def load_run(path: str | Path, *, strict: bool = True) -> RunLog:
    """Read one log. strict: raise LogError listing every malformed line (file:line: reason)."""
    events, problems = read_events(path)
    if strict and problems:
        raise LogError("\n".join(str(p) for p in problems))
    if strict and not events:
        raise LogError(f"{path}: no ':::MLLOG ' lines: not an MLPerf log")
    return RunLog(path=str(path), events=events, problems=problems)
