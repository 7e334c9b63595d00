"""Failure handling: a run ends with run_stop status aborted and a non-zero exit, never a hang.

- NaN/Inf loss or gradient norm: `check_finite` raises RunAborted (all ranks see the same global
  loss, so all stop at the same step).
- SIGTERM/SIGINT (Slurm walltime, scancel, torchrun tearing down a failed job): the loop stops at
  the next step boundary. If the main thread is stuck in a collective whose peer died, a watchdog
  thread (woken by the signal through a wakeup fd, which works while the main thread is blocked
  in C++) logs run_stop aborted itself after `grace_s` and exits the process.
- A killed rank: the surviving ranks' next collective fails (gloo: connection closed; NCCL:
  process-group timeout), the exception ends the loop, run_stop aborted is logged.
"""
from __future__ import annotations

import math
import os
import signal
import socket
import threading


class RunAborted(RuntimeError):
    """The run cannot continue; the message says why."""


def check_finite(step: int, loss: float, grad_norm: float | None) -> None:
    if not math.isfinite(loss):
        raise RunAborted(f"non-finite training loss {loss} at step {step}")
    if grad_norm is not None and not math.isfinite(grad_norm):
        raise RunAborted(f"non-finite gradient norm {grad_norm} at step {step}")


class SignalWatch:
    """Turns SIGTERM/SIGINT into a stop request; forces the exit if the loop cannot react."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, *, on_force_exit, grace_s: float = 20.0):
        self.on_force_exit = on_force_exit   # callable(reason) -> None, logs run_stop aborted
        self.grace_s = grace_s
        self.received: int | None = None
        self.done = threading.Event()
        self._old = {}
        self._r = self._w = None
        self._old_fd = -1

    @property
    def stop_requested(self) -> bool:
        return self.received is not None

    def reason(self) -> str:
        return f"received {signal.Signals(self.received).name}" if self.received else ""

    def install(self) -> "SignalWatch":
        if threading.current_thread() is not threading.main_thread():
            return self
        for s in self.SIGNALS:
            self._old[s] = signal.signal(s, self._handler)
        self._r, self._w = socket.socketpair()
        self._r.setblocking(True)
        self._w.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="signal-watchdog", daemon=True).start()
        return self

    def _handler(self, signum, frame):
        self.received = signum

    def _watch(self):
        try:
            data = self._r.recv(1)
        except OSError:
            return
        if not data or self.done.is_set():
            return
        self.received = self.received or data[0]
        if self.done.wait(self.grace_s):
            return
        # the main thread did not get back to Python in time (blocked in a collective)
        try:
            self.on_force_exit(f"{self.reason()}; main loop unresponsive for {self.grace_s:.0f} s")
        finally:
            os._exit(128 + (self.received or signal.SIGTERM))

    def uninstall(self):
        self.done.set()
        if self._r is None:
            return
        try:
            self._w.send(b"\0")   # wake the watchdog so it sees `done` and returns
        except OSError:
            pass
        signal.set_wakeup_fd(self._old_fd)
        for s, h in self._old.items():
            signal.signal(s, h)
        for sock in (self._w, self._r):
            try:
                sock.close()
            except OSError:
                pass
