"""Named hook points of the training loop. A hook overrides the methods it needs; the loop calls
them in this order:

  on_init_start -> on_init_stop -> on_run_start
    -> (on_block_start -> on_step_end* -> on_block_stop -> on_eval_start -> on_eval_end)*
  -> on_run_stop (always, also when the run fails)

  on_signal(reason): SIGTERM/SIGINT, called at once from the signal watchdog THREAD, whatever the
  main thread is doing (see train/failure.py): thread-safe, nothing that can block on a peer.

Hooks never raise into the loop for cosmetic reasons; a hook that must stop the run at once
raises; one that wants every rank to stop together at the next step calls
`run.request_stop(reason)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # the loop imports this module: its Run is the hooks' argument
    from .loop import Run


@dataclass(slots=True)
class StepStats:
    step: int
    """Optimizer steps completed (1 after the first step)."""
    samples: int
    """Training samples consumed so far."""
    loss: float
    """Mean per-token training loss of the global batch."""
    lr: float
    grad_norm: float
    step_time_s: float
    next_eval_step: int


class Hook:
    def on_init_start(self, run: Run) -> None: ...
    def on_init_stop(self, run: Run) -> None: ...
    def on_run_start(self, run: Run) -> None: ...
    def on_block_start(self, run: Run, step: int, block_samples: int) -> None: ...
    def on_step_end(self, run: Run, stats: StepStats) -> None: ...
    def on_block_stop(self, run: Run, step: int, block_samples: int) -> None: ...
    def on_eval_start(self, run: Run, step: int) -> None: ...
    def on_eval_end(self, run: Run, step: int, value: float, eval_time_s: float) -> None: ...
    def on_run_stop(self, run: Run, status: str, reason: str) -> None: ...
    def on_signal(self, run: Run, reason: str) -> None: ...


class Hooks(Hook):
    """Calls each registered hook in order."""

    def __init__(self, hooks: list[Hook]) -> None:
        self.hooks = list(hooks)

    def on_init_start(self, run: Run) -> None:
        for h in self.hooks:
            h.on_init_start(run)

    def on_init_stop(self, run: Run) -> None:
        for h in self.hooks:
            h.on_init_stop(run)

    def on_run_start(self, run: Run) -> None:
        for h in self.hooks:
            h.on_run_start(run)

    def on_block_start(self, run: Run, step: int, block_samples: int) -> None:
        for h in self.hooks:
            h.on_block_start(run, step, block_samples)

    def on_step_end(self, run: Run, stats: StepStats) -> None:
        for h in self.hooks:
            h.on_step_end(run, stats)

    def on_block_stop(self, run: Run, step: int, block_samples: int) -> None:
        for h in self.hooks:
            h.on_block_stop(run, step, block_samples)

    def on_eval_start(self, run: Run, step: int) -> None:
        for h in self.hooks:
            h.on_eval_start(run, step)

    def on_eval_end(self, run: Run, step: int, value: float, eval_time_s: float) -> None:
        for h in self.hooks:
            h.on_eval_end(run, step, value, eval_time_s)

    def on_run_stop(self, run: Run, status: str, reason: str) -> None:
        for h in self.hooks:
            h.on_run_stop(run, status, reason)

    def on_signal(self, run: Run, reason: str) -> None:
        for h in self.hooks:
            h.on_signal(run, reason)
