"""The next step's batch, read off the critical path.

A loader thread builds the microbatches of step k+1 (dataset reads, stacking, pinning on GPU)
while step k computes. It calls the same function the loop would call, for the steps in order,
so the content and order are exactly the synchronous ones: a run with the loader is bitwise the
run without it. The queue holds at most `depth` steps; `close()` stops the thread promptly, also
while it waits on a full queue or the run ends early (target, NaN, signal), and an error in the
thread is raised in the loop at the step that needed the batch (as a RuntimeError naming the
step, or, for the classes in `keep_types`, e.g. the DataError of a file changed under the run,
as its own class, so that the run's reason and exit status say what it is).

Started lazily by the first training step, so nothing reads the dataset before run_start.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar, cast

_POLL_S = 0.1

T = TypeVar("T")
"""What `make` gives for a step (the loop: the step's microbatches)."""


class Prefetcher(Generic[T]):
    def __init__(self, make: Callable[[int], T], *, start: int, stop: int, depth: int = 2,
                 name: str = "batch-prefetch",
                 keep_types: tuple[type[BaseException], ...] = ()) -> None:
        self._make = make
        self._keep_types = keep_types
        self._next = start
        # (step, its item, None) or (step, None, the error that `make` raised for it)
        self._queue: queue.Queue[tuple[int, T | None, BaseException | None]] = queue.Queue(
            maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(start, stop), name=name,
                                        daemon=True)
        self._thread.start()

    def _put(self, item: tuple[int, T | None, BaseException | None]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, start: int, stop: int) -> None:
        for k in range(start, stop):
            if self._stop.is_set():
                return
            try:
                item: tuple[int, T | None, BaseException | None] = (k, self._make(k), None)
            except BaseException as e:  # noqa: BLE001 - handed to the loop, raised there
                self._put((k, None, e))
                return
            if not self._put(item):
                return

    def get(self, step: int) -> T:
        """The batch of `step` (steps are asked for in order, from `start`)."""
        if step != self._next:
            raise RuntimeError(f"prefetcher: step {step} asked for, step {self._next} is next")
        while True:
            try:
                k, item, err = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError(f"prefetcher: the loader thread ended before step {step}")
        if err is not None:
            if isinstance(err, self._keep_types):
                raise type(err)(f"reading the batch of step {k}: {err}") from err
            raise RuntimeError(f"reading the batch of step {k} failed: {err}") from err
        self._next = k + 1
        return cast(T, item)   # None only beside an error

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the loader thread and drop what it prepared; idempotent. The queue is emptied
        after the thread is told to stop and has had `timeout_s` to end: emptied first, it would
        make room for the batch the thread was waiting to put, which then stayed queued."""
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
