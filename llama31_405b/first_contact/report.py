"""The first-contact report: one entry per check (passed, failed or not run, with the reason,
seconds and figures), written to a JSON file after every change so that a run killed by its
time limit still leaves every result it reached, and a time budget the phases consult before
they start."""
from __future__ import annotations

import dataclasses
import json
import os
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

CHECKS = ("gpu", "transformer_engine", "recipe", "gradient_accumulation_fusion", "build",
          "checkpoint_save", "checkpoint_load", "warmup_and_graphs", "replay_equals_eager",
          "steps", "evaluation", "profile", "dp2_eval_sync", "matmul_ceiling",
          "matmul_ceiling_fp8", "gemms_tp4", "layer_bf16", "nvfp4_emulation")
"""Every check, in report order. Phases (and the checks each owns): "slice" (build ..
evaluation, profile), "dp2" (dp2_eval_sync), "layer" (matmul_ceiling, matmul_ceiling_fp8,
gemms_tp4, layer_bf16, nvfp4_emulation); gpu, transformer_engine, recipe and
gradient_accumulation_fusion are always run."""

PHASES = {"layer": ("matmul_ceiling", "matmul_ceiling_fp8", "gemms_tp4", "layer_bf16",
                    "nvfp4_emulation"),
          "slice": ("build", "checkpoint_save", "checkpoint_load", "warmup_and_graphs",
                    "replay_equals_eager", "steps", "evaluation", "profile"),
          "dp2": ("dp2_eval_sync",)}


@dataclass
class Check:
    name: str
    status: str = "not run"
    """"passed", "failed" or "not run"."""
    detail: str = ""
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)
    """Figures of the check (times, ratios, versions), for the JSON report. Any: JSON values of
    every kind (numbers, strings, lists, nested tables) that the phases also read back."""


class Report:
    """The checks of one first-contact process. `path`: the JSON file rewritten after each
    change; `budget_s`: seconds this process may spend (None: no limit)."""

    def __init__(self, *, tracebacks: bool = False, path: str | Path | None = None,
                 budget_s: float | None = None, meta: dict[str, object] | None = None) -> None:
        self.checks = {n: Check(n) for n in CHECKS}
        self.tracebacks = tracebacks
        self.path = Path(path) if path else None
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        self.meta: dict[str, object] = dict(meta or {})
        self.current: str | None = None
        """The check in progress (Timed), named in the report until it ends."""
        self.save()

    # -- status -------------------------------------------------------------------------------
    def passed(self, check: str, detail: str = "", /, **data: object) -> None:
        c = self.checks[check]
        c.status, c.detail = "passed", detail
        c.data.update(data)
        self.save()

    def failed(self, check: str, detail: str, /, **data: object) -> None:
        c = self.checks[check]
        c.status, c.detail = "failed", detail
        c.data.update(data)
        self.save()

    def not_run(self, name: str, reason: str) -> None:
        c = self.checks[name]
        if c.status == "not run" and not c.detail:
            c.detail = reason
            self.save()

    def rest_not_run(self, reason: str, names: Iterable[str] | None = None) -> None:
        for n in names if names is not None else CHECKS:
            c = self.checks[n]
            if c.status == "not run" and not c.detail:
                c.detail = reason
        self.save()

    def ok(self, name: str) -> bool:
        return self.checks[name].status == "passed"

    @property
    def failures(self) -> int:
        return sum(c.status == "failed" for c in self.checks.values())

    # -- time -----------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def time_left(self) -> float:
        """Seconds left of the budget (infinite without one)."""
        return float("inf") if self.budget_s is None else self.budget_s - self.elapsed()

    def afford(self, names: Iterable[str], needs_s: float, what: str) -> bool:
        """True if `needs_s` seconds are left; else the checks `names` are marked not run."""
        left = self.time_left()
        if left >= needs_s:
            return True
        self.rest_not_run(f"time budget: {max(left, 0):.0f} s left of {self.budget_s:.0f} s, "
                          f"{what} needs about {needs_s:.0f} s", names)
        return False

    # -- output ---------------------------------------------------------------------------------
    def text(self) -> str:
        w = max(len(n) for n in CHECKS)
        return "\n".join(f"{c.name:<{w}}  {c.status:<7}  {c.detail}" + (
            f"  ({c.seconds:.1f} s)" if c.seconds else "") for c in self.checks.values())

    def as_json(self) -> str:
        return json.dumps([dataclasses.asdict(c) for c in self.checks.values()], indent=2)

    def document(self) -> dict[str, object]:
        return {"meta": {**self.meta, "elapsed_s": round(self.elapsed(), 1),
                         "budget_s": self.budget_s},
                "summary": {s: sum(c.status == s for c in self.checks.values())
                            for s in ("passed", "failed", "not run")},
                "checks": [dataclasses.asdict(c) for c in self.checks.values()]}

    def save(self) -> None:
        """Rewrite the JSON file (atomically: a reader never sees half a file)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.document(), indent=2, default=str))
        os.replace(tmp, self.path)

    def progress(self, msg: str) -> None:
        """Where the check in progress is (the report keeps it if the process is killed)."""
        if self.current is not None:
            c = self.checks[self.current]
            if c.status == "not run":
                c.detail = f"did not finish (killed or hung?); last: {msg} at {self.elapsed():.0f} s"
                self.save()
        self.log(msg)

    def log(self, msg: str) -> None:
        """Progress on stderr (the device script's log keeps it)."""
        import sys
        print(f"[first-contact {self.elapsed():6.1f} s] {msg}", file=sys.stderr, flush=True)


class Timed:
    """`with Timed(rep, name):` times a check and turns an exception into its failure."""

    def __init__(self, report: Report, name: str) -> None:
        self.report, self.name = report, name

    def __enter__(self) -> Timed:
        self.t0 = time.perf_counter()
        self.report.current = self.name
        self.report.progress(f"{self.name} started")
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        c = self.report.checks[self.name]
        c.seconds = time.perf_counter() - self.t0
        self.report.current = None
        if exc is not None and not isinstance(exc, KeyboardInterrupt):
            detail = f"{type(exc).__name__}: {exc}"
            if self.report.tracebacks:
                detail += "\n" + "".join(traceback.format_exception(typ, exc, tb))
            self.report.failed(self.name, detail)
        elif c.status == "not run" and c.detail.startswith("did not finish"):
            c.detail = ""
            self.report.save()
        else:
            self.report.save()
        self.report.log(f"{self.name}: {c.status} ({c.seconds:.1f} s) {c.detail[:300]}")
        return exc is not None and not isinstance(exc, KeyboardInterrupt)
