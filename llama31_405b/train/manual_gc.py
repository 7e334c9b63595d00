"""Manual garbage collection (performance.manual_gc): no GC pause at a random step.

Python's automatic collector stops one rank at unpredictable moments; every other rank then
waits for it at the next collective. With manual GC the automatic collector is off from the end
of init to run_stop, training and evaluation alike, and a full collection runs:

- once at the end of init (before run_start, so the timed run starts with a clean heap);
- after every `manual_gc_interval`-th training step;
- in evaluation, after every `manual_gc_interval`-th validation step, where an evaluation counts
  as ceil(eval_samples / GBS) validation steps (the global batches of validation data it reads).

The proven GB200 run collects every 1000 steps in training and validation alike.
"""
from __future__ import annotations

import gc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config.schema import Config


class ManualGC:
    def __init__(self, *, enabled: bool, interval: int, eval_steps_per_eval: int) -> None:
        self.enabled = enabled
        self.interval = max(1, interval)
        self.eval_steps_per_eval = max(1, eval_steps_per_eval)
        self.eval_steps = 0
        self.collections: list[tuple[str, int]] = []
        """(phase, step count) of every manual collection, for tests and logs."""

    @classmethod
    def from_config(cls, cfg: Config) -> ManualGC:
        d = cfg.derived
        return cls(enabled=cfg.performance.manual_gc,
                   interval=cfg.performance.manual_gc_interval,
                   eval_steps_per_eval=-(-d.eval_samples // d.gbs))

    def _collect(self, phase: str, count: int) -> None:
        gc.collect()
        self.collections.append((phase, count))

    def start(self) -> None:
        """End of init: automatic GC off, one full collection."""
        if self.enabled:
            gc.disable()
            self._collect("init", 0)

    def after_train_step(self, step: int) -> None:
        if self.enabled and step % self.interval == 0:
            self._collect("train", step)

    def after_eval(self) -> None:
        if not self.enabled:
            return
        before = self.eval_steps
        self.eval_steps += self.eval_steps_per_eval
        if self.eval_steps // self.interval > before // self.interval:
            self._collect("eval", self.eval_steps)

    def stop(self) -> None:
        """run_stop (also after a failure): automatic GC back on."""
        gc.enable()
