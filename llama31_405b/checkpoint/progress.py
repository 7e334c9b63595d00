"""Progress lines for long byte-bound work: done/total, rate, ETA (one line per interval)."""
from __future__ import annotations

import sys
import time


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def human_seconds(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s"


class ByteProgress:
    """`update(nbytes, what)` after each unit of work; prints `label: done/total (pct) rate ETA`."""

    def __init__(self, label: str, total: int, *, already: int = 0, interval_s: float = 2.0,
                 stream=None):
        self.label, self.total, self.interval = label, max(total, 1), interval_s
        self.done = already
        self._start_done = already
        self._t0 = time.monotonic()
        self._last = -1e9
        self.stream = stream if stream is not None else sys.stderr

    def line(self, what: str = "") -> str:
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        rate = (self.done - self._start_done) / elapsed
        left = self.total - self.done
        eta = human_seconds(left / rate) if rate > 0 else "?"
        pct = 100.0 * self.done / self.total
        tail = f"  [{what}]" if what else ""
        return (f"{self.label}: {human_bytes(self.done)} / {human_bytes(self.total)} "
                f"({pct:5.1f}%)  {human_bytes(rate)}/s  ETA {eta}{tail}")

    def update(self, nbytes: int, what: str = "", *, force: bool = False) -> None:
        self.done += nbytes
        now = time.monotonic()
        if force or self.done >= self.total or now - self._last >= self.interval:
            self._last = now
            print(self.line(what), file=self.stream, flush=True)
