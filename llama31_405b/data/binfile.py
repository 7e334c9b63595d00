"""Reading a dataset's .bin during training: `pread`, never a memory map, and a check that the
file is still the one the run started with.

Why not a map: a mapped file that shrinks under the process (a `.bin` overwritten in place by a
shorter file) turns the next read of a vanished page into SIGBUS, which kills the process inside
NumPy's copy (in the loader thread too) before any Python code can log run_stop or name the file.
A Python-level SIGBUS handler cannot help: Python runs it only after the C code returned, which
a faulting read never does. `os.pread` returns fewer bytes instead, and that becomes a
DataError naming the file.

Why the check: a file replaced (new inode), rewritten (mtime) or resized since the run's datasets
were built would give other tokens than the verified ones, silently. The file's `os.stat` (size,
inode, device, mtime) is compared with the stamp taken when the datasets were built (before
run_start: stat is metadata, allowed then) at the first read and then before any read that comes
`CHECK_INTERVAL_S` or more after the last check (a training sample is ~20 reads, one per
document piece: a stat per read cost as much as the read); any difference is a DataError naming
the file and what changed. A shrink is caught by the next read that goes to the file, whatever
the interval: a read past the new end comes back short (reads served from the bytes the last
read fetched ahead, `READ_AHEAD`, return what the file held then). The cost, measured by
`bench/loader.py` against megatron-core's memory-mapped reader on the same samples, is in
docs/data.md ("Data changed under a run").

The file is opened at the first read (nothing touches the dataset before run_start) and once per
process: a pickled copy (a DataLoader worker) opens its own.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from .errors import DataError

MIN_READ, READ_AHEAD = 4 << 10, 64 << 10
"""Bytes read per system call, at least: twice what the reads served by the previous one
spanned, within these bounds. A training sample is the pieces of consecutive documents, back to
back in the file, so one read usually serves all of them (8,192 uint16 tokens are 16 KiB); the
bound keeps the copy small where samples are short."""
CHECK_INTERVAL_S = 0.05
"""A change is found by the first read this long after it, at the latest (and the loop raises it
at the step that needed the batch: within seconds)."""


@dataclass(frozen=True)
class FileStamp:
    """What identifies a file's contents without reading them."""
    size: int
    mtime_ns: int
    ino: int
    dev: int

    @classmethod
    def of(cls, path: str) -> "FileStamp":
        st = os.stat(path)
        return cls(size=st.st_size, mtime_ns=st.st_mtime_ns, ino=st.st_ino, dev=st.st_dev)

    def differences(self, now: "FileStamp") -> list[str]:
        out = []
        if (now.ino, now.dev) != (self.ino, self.dev):
            out.append("replaced by another file (inode changed)")
        if now.size != self.size:
            out.append(f"size {self.size} -> {now.size} bytes")
        if now.mtime_ns != self.mtime_ns:
            out.append("modified (mtime changed)")
        return out


def changed_error(path: str, what: list[str], since: str) -> DataError:
    return DataError(f"{path}: changed under the running job ({', '.join(what)}) since {since}; "
                     "the tokens read now are not the verified ones. Restore the file, run "
                     "`python -m llama31_405b data verify CONFIG` and start a new run")


class BinFile:
    """Reads token arrays from one .bin by offset; see the module docstring."""

    def __init__(self, path: str, stamp: FileStamp | None = None,
                 since: str = "the datasets were built") -> None:
        self.path = str(path)
        self.stamp = stamp if stamp is not None else FileStamp.of(self.path)
        self.since = since
        self._fd: int | None = None
        self._checked = -float("inf")
        self._buf, self._buf_at, self._span = b"", 0, 0

    def _check(self) -> None:
        now = time.monotonic()
        if now - self._checked < CHECK_INTERVAL_S:
            return
        self._checked = now
        try:
            stamp = FileStamp.of(self.path)
        except OSError as e:
            raise DataError(f"{self.path}: cannot be read any more ({e.strerror}) since "
                            f"{self.since}: the file was removed or its folder unmounted under "
                            "the running job; restore it and start a new run") from None
        what = self.stamp.differences(stamp)
        if what:
            raise changed_error(self.path, what, self.since)

    def read(self, dtype, count: int, offset: int) -> np.ndarray:
        """`count` items of `dtype` from byte `offset` (read-only, like a map's view)."""
        self._check()
        want = count * np.dtype(dtype).itemsize
        start = offset - self._buf_at
        if 0 <= start and start + want <= len(self._buf):   # the next piece of the same sample
            self._span = max(self._span, start + want)
            return np.frombuffer(self._buf, dtype=dtype, count=count, offset=start)
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        ahead = min(max(2 * self._span, MIN_READ), READ_AHEAD)
        self._span = want
        data = os.pread(self._fd, max(want, ahead), offset)
        while 0 < len(data) < want:   # a read may return less without reaching the end
            more = os.pread(self._fd, want - len(data), offset + len(data))
            if not more:
                break
            data += more
        if len(data) < want:
            size = os.fstat(self._fd).st_size
            raise DataError(f"{self.path}: {count} tokens asked for at byte {offset}, the file "
                            f"now holds {size} bytes: it shrank under the running "
                            f"job (size {self.stamp.size} bytes when {self.since}); restore it, "
                            "run `python -m llama31_405b data verify CONFIG` and start a new run")
        self._buf, self._buf_at = data, offset
        return np.frombuffer(data, dtype=dtype, count=count)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fd"], state["_buf"], state["_buf_at"] = None, b"", 0
        return state
