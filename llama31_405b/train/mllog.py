"""The MLPerf logger as one hook: rank 0 only, lines on stdout and in the log file.

Nothing is logged when the hook is constructed. The header comes from
`llama31_405b.mlperf.header.header_events` (the same events the compliance precheck checks).
Block and eval events follow the published llama31_405b logs: block_start/stop carry the block's
sample count and the step, eval events and eval_accuracy the cumulative training samples.
"""
from __future__ import annotations

import logging
import sys

from ..mlperf.header import header_events
from .hooks import Hook


class MLPerfLogHook(Hook):
    def __init__(self, cfg, *, seed: int, log_file: str | None, rank: int,
                 cache_cleared: bool = False):
        self.cfg, self.seed, self.log_file, self.rank = cfg, seed, log_file, rank
        self.cache_cleared = cache_cleared
        self._ml = None
        self._constants = None
        self.run_stopped = False

    # -- plumbing -------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self.rank == 0

    def _logger(self):
        if self._ml is None:
            from mlperf_logging.mllog import constants
            from mlperf_logging.mllog.mllog import MLLogger
            pylog = logging.getLogger(f"llama31_405b.mllog.{id(self)}")
            pylog.propagate = False
            pylog.setLevel(logging.INFO)
            pylog.addHandler(logging.StreamHandler(sys.stdout))
            if self.log_file:
                pylog.addHandler(logging.FileHandler(self.log_file, mode="a"))
            self._ml = MLLogger(logger=pylog, default_stack_offset=2)
            self._constants = constants
        return self._ml

    def event(self, key, value=None, metadata=None):
        if self.active:
            self._logger().event(key=key, value=value, metadata=metadata)

    def start(self, key, value=None, metadata=None):
        if self.active:
            self._logger().start(key=key, value=value, metadata=metadata)

    def end(self, key, value=None, metadata=None):
        if self.active:
            self._logger().end(key=key, value=value, metadata=metadata)

    def flush(self):
        if self._ml is not None:
            for h in self._ml.logger.handlers:
                h.flush()

    # -- hook points ----------------------------------------------------------------------------
    def on_init_start(self, run):
        self.event("cache_clear", self.cache_cleared)
        self.start("init_start")
        for ev in header_events(self.cfg, seed=self.seed):
            self.event(ev.key, ev.value, ev.metadata or None)

    def on_init_stop(self, run):
        self.end("init_stop")

    def on_run_start(self, run):
        self.start("run_start")
        self.flush()

    def on_block_start(self, run, step, block_samples):
        self.start("block_start", metadata={"samples_count": block_samples, "step": step})

    def on_block_stop(self, run, step, block_samples):
        self.end("block_stop", metadata={"samples_count": block_samples, "step": step})

    def on_eval_start(self, run, step):
        self.start("eval_start", metadata={"samples_count": run.samples, "step": step})

    def on_eval_end(self, run, step, value, eval_time_s):
        self.event("eval_accuracy", value, metadata={"samples_count": run.samples, "step": step})
        self.end("eval_stop", metadata={"samples_count": run.samples, "step": step})
        self.flush()

    def on_run_stop(self, run, status, reason):
        if self.run_stopped:
            return
        self.run_stopped = True
        # a run that failed during init gets run_stop without run_start: the log ends in
        # status aborted and the checker rejects it, as it should
        meta = {"samples_count": run.samples, "step": run.step, "status": status}
        if reason:
            meta["reason"] = reason[:500]
        self.end("run_stop", metadata=meta)
        self.flush()
