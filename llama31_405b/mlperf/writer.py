"""Write an MLPerf log: one `:::MLLOG` line per event, straight to the file.

Not through Python logging (what mlperf_logging.mllog.MLLogger writes with): a logging handler
that cannot write prints a traceback per event and carries on, so a full disk went unnoticed
until a later flush; and its buffers and locks are not meant for the thread that logs run_stop on
a signal while the main thread may be anywhere (inside a collective, or inside a log write).

- Each line goes to the file with `os.write` on an O_APPEND descriptor: nothing waits in a
  process buffer, so a line written survives a SIGKILL a moment later. The file is fsync'ed where
  it matters (run_start, evaluations, run_stop) and at least every `sync_interval_s` seconds, so
  an error a network filesystem reports late (at fsync) is seen within seconds too.
- The first failed write (full disk, lost mount, permission) raises `LogWriteError`, once, naming
  the path and the cause. After it the writer takes nothing but one last run_stop attempt (on a
  fresh line, in case the failed write left half a line).
- A file that already holds MLPerf events (`:::MLLOG`) is refused when the writer is made
  (`LogExistsError`, exit status 2): a result file is never appended to, so no file holds two
  runs. An empty file is taken (a launcher may create it). At the first event the file is
  claimed: created O_EXCL (or an empty one taken), held under the writer's own flock and looked
  at again once locked, so of two runs given one path at once (outside run_and_time.sh, or where
  its flock only warns) the second is refused (LogExistsError), never appended to the first's.
- `run_stop` is written exactly once, whichever thread comes first (the training loop or the
  signal watchdog); every event after it is dropped, so the log ends with it.
- Each line is copied to `echo` (stdout by default, where the launcher collects it). A copy that
  fails is dropped with one warning and never stops the run, unless there is no file: then the
  copy is the log.

Lines are formatted as MLLogger formats them (`log.format_line`; a test compares the two), with
the caller's file and line in the metadata (the package checker's seed check reads them).
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .log import LogError, event_type_for, format_line

REPO = Path(__file__).resolve().parents[2]


class LogWriteError(RuntimeError):
    """The MLPerf log cannot be written; the message names the path and the cause."""

    def __init__(self, path: str, cause: OSError, action: str = "write"):
        code = errno.errorcode.get(cause.errno or 0, "")
        why = cause.strerror or str(cause)
        super().__init__(f"cannot {action} the MLPerf log {path}: {why}"
                         + (f" ({code})" if code else ""))
        self.path, self.cause = path, cause


class LogExistsError(LogError):
    """The MLPerf log file already holds events; the message names it and what to do (a
    LogError: bad input, exit status 2, the message printed as is)."""


def refuse_existing_log(path: str) -> None:
    """Raise LogExistsError when `path` already holds an MLPerf event (a `:::MLLOG` line)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return  # a device or a pipe (/dev/stdout): nothing to keep
        with open(path, "rb") as f:
            held = any(b":::MLLOG" in chunk for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return      # nothing there yet; a folder or an unreadable file fails at the open
    if held:
        raise LogExistsError(
            f"the MLPerf log {path} already holds MLPerf events (an earlier run's log): a result "
            "file is never appended to or replaced; pass a new --mlperf-log path, or move that "
            "file away first")


def _caller(depth: int) -> dict:
    """{"file", "lineno"} of the frame `depth` levels above the caller of this function; the file
    relative to the repository when it lies inside it (MLLogger's root_dir trimming)."""
    f = sys._getframe(depth + 1)
    name = f.f_code.co_filename
    try:
        name = str(Path(name).relative_to(REPO))
    except ValueError:
        pass
    return {"file": name, "lineno": f.f_lineno}


class MLLogWriter:
    def __init__(self, path: str | os.PathLike | None, *, echo: Any = None,
                 sync_interval_s: float = 2.0):
        """path: the log file (None: `echo` is the log); refused (LogExistsError) when it holds
        MLPerf events already. echo: a text stream that gets a copy of every line (default
        sys.stdout; False for none)."""
        self.path = os.fspath(path) if path else None
        if self.path is not None:
            refuse_existing_log(self.path)
        self.echo = sys.stdout if echo is None else (echo or None)
        if self.path is None and self.echo is None:
            raise ValueError("an MLPerf log needs a file or an echo stream")
        self.sync_interval_s = sync_interval_s
        self.failed: LogWriteError | None = None
        self.stopped = False
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._partial = False
        self._last_sync = time.monotonic()

    # -- events -----------------------------------------------------------------------------------
    def write(self, key: str, value: Any = None, metadata: dict | None = None, *,
              event_type: str | None = None, sync: bool = False, stack_offset: int = 1,
              time_ms: int | None = None) -> bool:
        """Log one event; False when it was dropped (after run_stop, or after a failed write).
        Raises LogWriteError at the first write that fails. stack_offset: frames above this
        call whose file and line the metadata names (1: the direct caller). time_ms: the event's
        time when the caller fixed it (default: now)."""
        line = self._line(key, value, metadata, event_type, stack_offset + 1, time_ms)
        with self._lock:
            if self.stopped or self.failed is not None:
                return False
            self._emit(line, sync=sync)
            return True

    def run_stop(self, metadata: dict, *, stack_offset: int = 1, time_ms: int | None = None) -> bool:
        """Log run_stop (metadata carries status, reason, samples_count) and fsync it, exactly
        once: False when it was logged before. After an earlier failed write: one silent
        attempt; raises LogWriteError when this is the first write that fails. time_ms: when
        the run stopped (default: now)."""
        line = self._line("run_stop", None, metadata, None, stack_offset + 1, time_ms)
        with self._lock:
            if self.stopped:
                return False
            self.stopped = True
            if self.failed is None:
                self._emit(line, sync=True)
                return True
            try:          # the file failed before: one last try, e.g. the disk freed meanwhile
                self._to_file(line, sync=True)
            except OSError:
                pass
            self._echo(line)
            return True

    def sync(self) -> None:
        """fsync the file now (a point that matters: run_start, an evaluation)."""
        with self._lock:
            if self.failed is not None or self._fd is None or self.path is None:
                return
            try:
                self._fsync()
            except OSError as e:
                self.failed = LogWriteError(self.path, e)
                raise self.failed from None

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
                self._fd = None

    # -- plumbing (called with the lock held) -----------------------------------------------------
    def _line(self, key, value, metadata, event_type, depth, time_ms=None) -> str:
        meta = _caller(depth)
        meta.update(metadata or {})
        t = int(time.time() * 1e3) if time_ms is None else int(time_ms)
        return format_line(key, value, time_ms=t, metadata=meta,
                           event_type=event_type or event_type_for(key))

    def _emit(self, line: str, *, sync: bool) -> None:
        if self.path is not None:
            try:
                self._to_file(line, sync=sync)
            except OSError as e:
                action = "open" if self._fd is None else "write"
                self.failed = LogWriteError(self.path, e, action)
                self._echo(line)
                raise self.failed from None
        self._echo(line)

    def _claim(self) -> int | None:
        """The log, claimed at the first event: created O_CREAT|O_EXCL (two runs given one
        path: the kernel lets one create it), or an existing empty file taken; either way held
        under this writer's own flock for its life, and looked at again once locked. Another
        writer's file (locked, or holding events by then) raises LogExistsError. None when it
        cannot be opened now: the first write opens it and reports why (LogWriteError)."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
        assert self.path is not None
        try:
            fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                fd = os.open(self.path, flags)
            except OSError:
                return None
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return fd           # a device or a pipe (/dev/stdout): nothing to keep
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogExistsError(
                f"the MLPerf log {self.path} is being written by another run (its lock is held): "
                "a result file is never shared; pass a new --mlperf-log path") from None
        except OSError:
            pass                # no flock on this filesystem: the O_EXCL creation is the claim
        try:
            refuse_existing_log(self.path)    # events written before the lock was taken
        except LogExistsError:
            os.close(fd)
            raise
        return fd

    def _to_file(self, line: str, *, sync: bool) -> None:
        if self.path is None:   # `echo` is the log
            return
        if self._fd is None:
            self._fd = self._claim()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                               0o644)
        data = (("\n" if self._partial else "") + line + "\n").encode()
        done = 0
        try:
            while done < len(data):
                done += os.write(self._fd, data[done:])
        finally:
            if done:
                self._partial = done < len(data)
        if sync or time.monotonic() - self._last_sync >= self.sync_interval_s:
            self._fsync()

    def _fsync(self) -> None:
        if self._fd is None:
            return
        try:
            os.fsync(self._fd)
        except OSError as e:
            if e.errno != errno.EINVAL:      # EINVAL: a pipe or device, nothing to sync
                raise
        self._last_sync = time.monotonic()

    def _echo(self, line: str) -> None:
        if self.echo is None:
            return
        try:
            self.echo.write(line + "\n")
            self.echo.flush()
        except (OSError, ValueError) as e:
            stream, self.echo = getattr(self.echo, "name", "the echo stream"), None
            if self.path is None:
                cause = e if isinstance(e, OSError) else OSError(errno.EBADF, str(e))
                self.failed = LogWriteError(str(stream), cause)
                raise self.failed from None
            print(f"warning: the copy of the MLPerf log on {stream} failed ({e}); the log "
                  f"{self.path} goes on", file=sys.stderr, flush=True)
