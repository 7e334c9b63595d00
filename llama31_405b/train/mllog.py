"""The MLPerf logger as one hook: rank 0 only, lines in the log file and on stdout.

Nothing is logged when the hook is constructed. The header comes from
`llama31_405b.mlperf.header.header_events` (the same events the compliance precheck checks).
Block and eval events follow the published llama31_405b logs: block_start/stop carry the block's
sample count and the step, eval events and eval_accuracy the cumulative training samples, and
every step logs `tracked_stats` (step time, loss, LR, gradient norm). Lines go through
`mlperf.writer.MLLogWriter`: unbuffered, run_stop exactly once, from the loop or at once from the
signal watchdog (`on_signal`).

A failed write prints ONE error line (path and cause) on stderr and stops the run: at once
before run_start, else through `run.request_stop`, so every rank stops at the next step; the log
then ends with run_stop aborted where the file still takes it, and never with success.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from ..mlperf.header import header_events
from ..mlperf.writer import LogWriteError, MLLogWriter
from .failure import RunAborted
from .hooks import Hook, StepStats

if TYPE_CHECKING:
    from ..config.schema import Config
    from .failure import StopPoint
    from .loop import Run


class MLPerfLogHook(Hook):
    def __init__(self, cfg: Config, *, seed: int, log_file: str | None, rank: int,
                 cache_cleared: bool = False, echo: TextIO | bool | None = None) -> None:
        """echo: MLLogWriter's (a stream for a copy of every line; None: stdout; False: none)."""
        self.cfg, self.seed, self.log_file, self.rank = cfg, seed, log_file, rank
        self.cache_cleared = cache_cleared
        # created here (opens nothing) so the watchdog thread and the loop share one writer
        self.writer = MLLogWriter(log_file, echo=echo) if self.active else None

    # -- plumbing -------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self.rank == 0

    def _log(self, run: Run | None, key: str, value: object = None,
             metadata: dict[str, object] | None = None, *, sync: bool = False,
             time_ms: int | None = None) -> None:
        if self.writer is None:   # not rank 0 (`active`)
            return
        try:
            # stack_offset 2: the metadata names the hook method's line, as MLLogger did
            self.writer.write(key, value, metadata, sync=sync, stack_offset=2, time_ms=time_ms)
        except LogWriteError as e:
            self._failed(run, e)

    def _failed(self, run: Run | None, e: LogWriteError) -> None:
        if run is not None and getattr(run, "run_started", False):
            print(f"error: {e}; stopping the run", file=sys.stderr, flush=True)
            run.request_stop(str(e), error=True)
        else:   # the train command says "stopped before run_start: <this>" (one line)
            raise RunAborted(str(e)) from None

    # -- hook points ----------------------------------------------------------------------------
    def on_init_start(self, run: Run) -> None:
        self._log(run, "cache_clear", self.cache_cleared)
        self._log(run, "init_start")
        for ev in header_events(self.cfg, seed=self.seed):
            self._log(run, ev.key, ev.value, ev.metadata or None)

    def on_init_stop(self, run: Run) -> None:
        self._log(run, "init_stop")

    def on_run_start(self, run: Run) -> None:
        # the run's own clock of run_start: the console's minutes are computed from the same
        start_ms: int | None = getattr(getattr(run, "state", None), "run_start_ms", None)
        self._log(run, "run_start", sync=True, time_ms=start_ms)

    def on_block_start(self, run: Run, step: int, block_samples: int) -> None:
        self._log(run, "block_start", metadata={"samples_count": block_samples, "step": step})

    def on_step_end(self, run: Run, stats: StepStats) -> None:
        # per-step statistics, as the published logs carry them (the report plots step time)
        self._log(run, "tracked_stats", {"train_step_time": round(stats.step_time_s, 6),
                                         "train_loss": round(stats.loss, 6), "lr": stats.lr,
                                         "grad_norm": round(stats.grad_norm, 6)},
                  metadata={"samples_count": stats.samples, "step": stats.step})

    def on_block_stop(self, run: Run, step: int, block_samples: int) -> None:
        self._log(run, "block_stop", metadata={"samples_count": block_samples, "step": step})

    def on_eval_start(self, run: Run, step: int) -> None:
        self._log(run, "eval_start", metadata={"samples_count": run.samples, "step": step})

    def on_eval_end(self, run: Run, step: int, value: float, eval_time_s: float) -> None:
        self._log(run, "eval_accuracy", value,
                  metadata={"samples_count": run.samples, "step": step})
        self._log(run, "eval_stop", metadata={"samples_count": run.samples, "step": step},
                  sync=True)

    def on_signal(self, run: Run, reason: str) -> None:
        # the signal watchdog thread, at once: run_stop before anything that can block
        self._run_stop(run, "aborted", reason)

    def on_run_stop(self, run: Run, status: str, reason: str) -> None:
        self._run_stop(run, status, reason)
        if self.writer is not None:
            self.writer.close()

    def _run_stop(self, run: Run, status: str, reason: str) -> None:
        w = self.writer
        if w is None:   # not rank 0 (`active`)
            return
        # where and why the run stopped, fixed once by the loop (train.failure.StopPoint): the
        # console's summary reports the same values
        point: StopPoint | None = getattr(run, "stop_point", None)
        step, samples, time_ms = ((point.step, point.samples, point.time_ms) if point is not None
                                  else (run.step, run.samples, None))
        if w.failed is not None and status != "aborted":
            status, reason = "aborted", str(w.failed)
        # a run that failed during init gets run_stop without run_start: the log ends in
        # status aborted and the checker rejects it, as it should
        meta: dict[str, object] = {"samples_count": samples, "step": step, "status": status}
        if reason:
            meta["reason"] = reason[:500]
        try:
            w.run_stop(meta, stack_offset=2, time_ms=time_ms)
        except LogWriteError as e:     # the first failed write: say it, nothing else to stop
            print(f"error: {e}", file=sys.stderr, flush=True)
