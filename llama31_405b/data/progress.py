"""One progress line on stderr: done/total, docs/s, tokens/s, ETA (rewritten in place on a
terminal, one line every few seconds otherwise)."""
from __future__ import annotations

import sys
import time


def _si(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def _hms(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600:d}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    def __init__(self, label: str, total_bytes: int, *, stream=None, interval: float | None = None):
        self.label = label
        self.total = max(total_bytes, 1)
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval = interval if interval is not None else (0.2 if self.tty else 5.0)
        self.start = time.monotonic()
        self._last = 0.0
        self.docs = self.tokens = self.done_bytes = 0

    def update(self, *, docs: int, tokens: int, done_bytes: int, force: bool = False) -> None:
        self.docs, self.tokens, self.done_bytes = docs, tokens, done_bytes
        now = time.monotonic()
        if force or now - self._last >= self.interval:
            self._last = now
            self._draw(now)

    def line(self, now: float | None = None) -> str:
        el = max((now or time.monotonic()) - self.start, 1e-9)
        frac = min(self.done_bytes / self.total, 1.0)
        eta = el * (1 - frac) / frac if frac > 0 else float("nan")
        width = 24
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        eta_s = _hms(eta) if eta == eta else "?"
        return (f"{self.label} [{bar}] {frac * 100:5.1f}% {_si(self.docs)} docs "
                f"{_si(self.tokens)} tok | {_si(self.docs / el)} docs/s {_si(self.tokens / el)} "
                f"tok/s | {_hms(el)} elapsed, ETA {eta_s}")

    def _draw(self, now: float) -> None:
        end = "\r" if self.tty else "\n"
        self.stream.write(self.line(now) + end)
        self.stream.flush()

    def close(self) -> None:
        self.done_bytes = self.total
        self._draw(time.monotonic())
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()
