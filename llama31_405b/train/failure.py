"""Failure handling: a run ends with run_stop status aborted and a non-zero exit, never a hang.

- NaN/Inf loss or gradient norm: `check_finite` raises RunAborted (all ranks see the same global
  loss, so all stop at the same step).
- SIGTERM/SIGINT (Slurm walltime, scancel, torchrun tearing down a failed job): the signal wakes
  a watchdog thread through the interpreter's wakeup fd, which the C-level handler writes even
  while the main thread is blocked inside C++ (a collective, a kernel). The watchdog logs run_stop
  aborted at once (`on_signal`), before anything that can block, then the run stops as gracefully
  as time allows: every step's loss all-reduce carries each rank's `StopRequest`, so all ranks
  leave at the same step boundary and none waits on a rank that left. If the main thread has not
  finished `grace_s` after the signal, the watchdog exits the process. Slurm's SIGKILL (KillWait
  after SIGTERM) may come first: the log is already complete.
- A failed write of the MLPerf log: the log hook asks for the stop (see train/mllog.py).
- A killed rank: the surviving ranks' next collective fails (gloo: connection closed; NCCL:
  process-group timeout), the exception ends the loop, run_stop aborted is logged; or the
  launcher's SIGTERM comes first. Either reason names the lost rank when it ran on this node
  ("rank 3 lost (its process ended); received SIGTERM from the launcher", train/siblings.py).

Nothing runs in the Python-level signal handler but an assignment: it runs in the main thread
between two bytecodes, possibly inside the log writer's own lock.
"""
from __future__ import annotations

import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from .siblings import Siblings, describe_lost


class RunAborted(RuntimeError):
    """The run cannot continue; the message says why."""


def check_finite(step: int, loss: float, grad_norm: float | None) -> None:
    if not math.isfinite(loss):
        raise RunAborted(f"non-finite training loss {loss} at step {step}")
    if grad_norm is not None and not math.isfinite(grad_norm):
        raise RunAborted(f"non-finite gradient norm {grad_norm} at step {step}")


@dataclass(frozen=True, slots=True)
class StopPoint:
    """Where and why the run stopped, fixed once (`StopRequest.settle`/`signal`): the MLPerf log's
    run_stop and the console's summary both report these values."""
    status: str
    reason: str
    step: int
    samples: int
    time_ms: int
    """Wall clock (ms since the epoch) of the stop: run_stop's time_ms."""


# gloo and NCCL errors that mean a peer process is gone (torch 2.13 ProcessGroupGloo /
# ProcessGroupNCCL messages; DistBackendError / DistNetworkError are torch.distributed's classes)
_LOST_PEER = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "Connection refused", "ncclRemoteError", "remote process exited",
              "NCCL communicator was aborted", "Socket Timeout", "Read error")
_LOST_PEER_TYPES = ("DistBackendError", "DistNetworkError")
# a peer that did not answer within the process groups' timeout (gloo's "Timed out waiting
# 60000ms for recv operation to complete"; ProcessGroupNCCL's watchdog "Watchdog caught
# collective operation timeout")
_NO_ANSWER = ("Timed out waiting", "operation timeout", "DistTimeoutError")


def lost_peer(exc: BaseException) -> bool:
    """True when `exc` says a collective failed because a peer rank is gone or did not answer."""
    text = str(exc)
    return (any(c.__name__ in _LOST_PEER_TYPES for c in type(exc).__mro__)
            or any(m in text for m in _LOST_PEER) or no_answer(exc))


def no_answer(exc: BaseException) -> bool:
    """True when a collective failed because a peer did not answer in time."""
    text = f"{type(exc).__name__}: {exc}"
    return any(m in text for m in _NO_ANSWER)


def _backend_words(detail: str) -> str:
    """The backend's message without its source locations ('[../gloo/.../pair.cc:81] ')."""
    import re
    return re.sub(r"\[[^\]\s]*\.(?:cc|cpp|c|h|hpp|py):\d+\]\s*", "", detail).strip()


_siblings: Siblings | None = None
"""This process's sibling ranks, taken when the run's SignalWatch is installed (train.siblings)."""


def _lost_ranks() -> str:
    """'rank 3 lost (its process ended)' for the sibling ranks that have ended; '' if none."""
    lost = _siblings.lost() if _siblings is not None else []
    return describe_lost(lost) if lost else ""


def lost_rank_reason(exc: BaseException, detail: str) -> str:
    """The logged reason of a collective that failed because a peer is gone or did not answer;
    it names the lost rank when it ran on this node (train.siblings), the rank that stopped
    answering from the run's heartbeats (train.heartbeat)."""
    named = _lost_ranks()
    if named:
        return f"{named}: a collective failed because a peer rank is gone ({detail})"
    if no_answer(exc):
        from . import heartbeat
        hb = heartbeat.current
        stalled = heartbeat.describe(hb.stalled()) if hb is not None else ""
        words = _backend_words(detail)
        if stalled:
            return f"{stalled}: a collective timed out waiting for it ({words})"
        return f"a rank stopped answering: a collective timed out ({words})"
    return f"lost rank(s): a collective failed because a peer rank is gone ({detail})"


class StopRequest:
    """Why this rank wants the run to stop, set from any thread, read by the loop (which agrees on
    it with every rank at the next step).

    - `request(reason, error=)`: the first reason wins; `error`: the run can no longer succeed
      (its log is broken), whatever an evaluation says next.
    - `signal(reason, log)`: a signal. Unless the run already reached its target, records the
      stop and calls `log(reason)` (run_stop aborted) while holding the lock, so a run that
      reached its target keeps its success and one logged aborted never turns into a success.
    - `finish()`: the run reached its target; True when it may end in success.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reason = ""
        self.error = False
        self.signalled = False
        self.finished = False
        self.point: StopPoint | None = None
        """Where and why the run stopped, once known (the first cause wins)."""

    @property
    def requested(self) -> bool:
        return bool(self.reason)

    def request(self, reason: str, *, error: bool = False) -> None:
        with self._lock:
            self.reason = self.reason or reason
            self.error = self.error or error

    def signal(self, reason: str, log: Callable[[str], object],
               where: Callable[[], tuple[int, int]] | None = None) -> None:
        """where: () -> (step, samples): the run's position, fixed into `point` (a run whose
        stop is already settled, by a failed collective for one, keeps that first cause)."""
        with self._lock:
            if self.finished or self.point is not None:
                return
            self.signalled = True
            self.reason = self.reason or reason
            if where is not None:
                self.point = _point("aborted", reason, where)
            log(reason)

    def settle(self, status: str, reason: str, where: Callable[[], tuple[int, int]]) -> StopPoint:
        """Fix where and why the run stopped, unless that is known already (a signal, or an
        earlier failure, came first); the point that holds."""
        with self._lock:
            if self.point is None:
                self.point = _point(status, reason, where)
            return self.point

    def finish(self) -> bool:
        with self._lock:
            if self.signalled or self.error:
                return False
            self.finished = True
            return True


def _point(status: str, reason: str, where: Callable[[], tuple[int, int]]) -> StopPoint:
    import time
    step, samples = where()
    return StopPoint(status, reason, int(step), int(samples), int(time.time() * 1e3))


_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None
"""What signal.signal takes and returns."""


class SignalWatch:
    """Turns SIGTERM/SIGINT into `on_signal(reason)`, called at once from a watchdog thread, and
    exits the process if the run has not finished `grace_s` later."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, *, on_signal: Callable[[str], None], grace_s: float = 20.0) -> None:
        self.on_signal = on_signal   # must not block on a collective
        self.grace_s = grace_s
        self.received: int | None = None
        self._reason = ""
        self.done = threading.Event()
        self._old: dict[int, _Handler] = {}   # signal -> the handler install replaced
        self._pair: tuple[socket.socket, socket.socket] | None = None
        """(read, write) ends of the wakeup fd's socket pair: made by install."""
        self._old_fd = -1

    def reason(self) -> str:
        """'received SIGTERM'; when a sibling rank has ended (the launcher stops the others
        after one ends), 'rank 3 lost (its process ended); received SIGTERM from the launcher'."""
        if not self.received:
            return ""
        if self._reason:          # fixed when the signal came: later exits are not its cause
            return self._reason
        name = signal.Signals(self.received).name
        named = _lost_ranks()
        return f"{named}; received {name} from the launcher" if named else f"received {name}"

    def install(self) -> "SignalWatch":
        global _siblings
        if threading.current_thread() is not threading.main_thread():
            return self
        _siblings = Siblings.of_this_rank()
        for s in self.SIGNALS:
            self._old[s] = signal.signal(s, self._handler)
        r, w = self._pair = socket.socketpair()
        r.setblocking(True)
        w.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(r,), name="signal-watchdog",
                         daemon=True).start()
        return self

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        # main thread, between bytecodes: an assignment only (see the module docstring)
        self.received = self.received or signum

    def _watch(self, r: socket.socket) -> None:
        while True:
            try:
                data = r.recv(1)
            except OSError:
                return
            if not data or self.done.is_set():
                return
            if data[0] in self.SIGNALS:     # the wakeup fd carries every handled signal's number
                break
        self.received = self.received or data[0]
        self._reason = self.reason()
        timer = threading.Thread(target=self._exit_after_grace, name="signal-grace", daemon=True)
        timer.start()
        self.on_signal(self.reason())

    def _exit_after_grace(self) -> None:
        if self.done.wait(self.grace_s):
            return
        print(f"error: {self.reason()}: the run did not stop within {self.grace_s:.0f} s "
              "(blocked in a collective?); exiting", file=sys.stderr, flush=True)
        os._exit(128 + (self.received or signal.SIGTERM))

    def uninstall(self) -> None:
        self.done.set()
        if self._pair is None:
            return
        r, w = self._pair
        try:
            w.send(b"\0")   # wake the watchdog so it sees `done` and returns
        except OSError:
            pass
        signal.set_wakeup_fd(self._old_fd)
        for s, h in self._old.items():
            signal.signal(s, h)
        for sock in (w, r):
            try:
                sock.close()
            except OSError:
                pass
