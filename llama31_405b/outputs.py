"""The one owner of writing a result: every output a command keeps (logs, verdicts, reports,
plots, profiles, analyses, configs, checkpoints, submission trees, RCP files) is created here,
and never over an existing one.

- `create_exclusive(path, data | writer=)`: a file written in place, opened O_CREAT|O_EXCL (an
  existing file, or one created a moment earlier by another process, is refused by the kernel,
  not by a check before the write).
- `open_exclusive(path)`: the same for a file written as it goes (the MLPerf log).
- `publish(tmp, final)`: a file or folder written under a temporary name, moved into place by an
  operation that cannot replace: link(2) then unlink of the temporary name for a file;
  renameat2(RENAME_NOREPLACE) for a folder (Linux; where the kernel or filesystem does not offer
  it the move is refused, never done as check-then-rename).
- `mkdir_exclusive(path)`: a new folder (mkdir(2) fails on an existing one).
- `unique=True` on each of them, or `unique_path(default)`: where a default path is involved, the
  first free of `default`, `<stem>-2<suffix>`, `<stem>-3<suffix>`, ... is taken (by the creating
  call itself, so two commands never get the same one); the caller prints the path it got.
- `rewrite_own(path, data)`: a command's own in-progress file (created by this module in this
  process) rewritten until the command finishes; any other path is refused.

An existing target raises `OutputExists`, which names it and what to do (docs/cli.md, "Outputs").
This module is the lowest layer: it imports nothing of the package.
"""
from __future__ import annotations

import ctypes
import errno
import os
import secrets
from pathlib import Path
from typing import IO, Callable, Iterator

ADVICE = "choose another path, or move the existing one away first"
# what this process created through this module: the only paths rewrite_own accepts
_OWNED: set[Path] = set()


class OutputExists(FileExistsError):
    """A result that would replace an existing one."""

    def __init__(self, path: str | Path, advice: str = ADVICE, what: str = "") -> None:
        self.path = Path(path)
        self.advice = advice
        super().__init__(errno.EEXIST,
                         f"{what + ' ' if what else ''}{self.path} already exists, kept (a result "
                         f"is never replaced); {advice}")

    def __str__(self) -> str:
        return self.args[1]


class OutputError(OSError):
    """The output cannot be put in place without risking a replacement (no RENAME_NOREPLACE)."""


def candidates(default: str | Path) -> Iterator[Path]:
    """`default`, then `<stem>-2<suffix>`, `<stem>-3<suffix>`, ... (a folder: `<name>-2`, ...)."""
    p = Path(default)
    yield p
    n = 2
    while True:
        yield p.with_name(f"{p.stem}-{n}{p.suffix}")
        n += 1


def unique_path(default: str | Path) -> Path:
    """The first of `candidates(default)` that does not exist now: for a message or a name to
    pass on. The creating calls take `unique=True`, which claims the path atomically."""
    return next(c for c in candidates(default) if not os.path.lexists(c))


def temp_sibling(final: str | Path) -> Path:
    """A temporary name next to `final` (same folder, so the same filesystem), never a result."""
    f = Path(final)
    return f.with_name(f".{f.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def _claims(path: str | Path, unique: bool) -> Iterator[Path]:
    return candidates(path) if unique else iter([Path(path)])


def open_exclusive(path: str | Path, *, binary: bool = False, unique: bool = False,
                   advice: str = ADVICE, what: str = "") -> IO:
    """A new file opened for writing (O_CREAT|O_EXCL); its parent folders are made. The file
    object's `.name` is the path taken (with `unique`, maybe not `path`)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    for p in _claims(path, unique):
        try:
            # mode "x": O_CREAT|O_EXCL (the kernel refuses an existing file, atomically)
            f = open(p, "xb") if binary else open(p, "x", encoding="utf-8")
        except FileExistsError:
            if unique:
                continue
            raise OutputExists(p, advice, what) from None
        _OWNED.add(p.absolute())
        return f
    raise AssertionError("unreachable")


def create_exclusive(path: str | Path, data: str | bytes | None = None, *,
                     writer: Callable[[IO], object] | None = None, unique: bool = False,
                     advice: str = ADVICE, what: str = "") -> Path:
    """Create the file `path` holding `data` (text or bytes) or what `writer(file)` writes
    (binary); return the path taken. An existing file raises OutputExists (with `unique`, the next
    free name is taken). Should the writing fail, the partial file, this call's own, is removed."""
    if (data is None) == (writer is None):
        raise TypeError("create_exclusive: give data or writer, not both")
    f = open_exclusive(path, binary=writer is not None or isinstance(data, bytes), unique=unique,
                       advice=advice, what=what)
    p = Path(f.name)
    try:
        with f:
            if writer is not None:
                writer(f)
            else:
                f.write(data)
    except BaseException:
        p.unlink(missing_ok=True)
        _OWNED.discard(p.absolute())
        raise
    return p


def rewrite_own(path: str | Path, data: str) -> Path:
    """Rewrite a file this process created through this module (an in-progress report, rewritten
    after every check until the command finishes): written under a temporary name and moved
    over its own earlier version. Any other path is refused."""
    p = Path(path)
    if p.absolute() not in _OWNED:
        raise OutputExists(p, "rewrite_own rewrites only a file this command created "
                              "(create_exclusive / open_exclusive)")
    tmp = temp_sibling(p)
    tmp.write_text(data)
    os.replace(tmp, p)
    return p


def mkdir_exclusive(path: str | Path, *, unique: bool = False, advice: str = ADVICE,
                    what: str = "") -> Path:
    """Create the folder `path` (its parents as needed); an existing one raises OutputExists
    (with `unique`, the next free name is taken). Returns the folder made."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    for p in _claims(path, unique):
        try:
            os.mkdir(p)
        except FileExistsError:
            if unique:
                continue
            raise OutputExists(p, advice, what) from None
        _OWNED.add(p.absolute())
        return p
    raise AssertionError("unreachable")


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def rename_noreplace(src: str | Path, dst: str | Path) -> None:
    """rename(2) that fails on an existing `dst` (renameat2 with RENAME_NOREPLACE, glibc >= 2.28,
    Linux >= 3.15). FileExistsError if `dst` exists; OutputError where the call is not offered
    (another OS, an old kernel, a filesystem without it): no fallback that could replace."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        raise OutputError(errno.ENOSYS, f"cannot move {src} to {dst} without risking a "
                          "replacement: this C library has no renameat2 (RENAME_NOREPLACE)")
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
        return
    e = ctypes.get_errno()
    if e == errno.EEXIST:
        raise FileExistsError(e, os.strerror(e), str(dst))
    if e in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        raise OutputError(e, f"cannot move {src} to {dst} without risking a replacement: the "
                          f"kernel or filesystem refuses renameat2 RENAME_NOREPLACE "
                          f"({os.strerror(e)}); write the output on a local filesystem")
    raise OSError(e, os.strerror(e), str(dst))


def publish(tmp: str | Path, final: str | Path, *, unique: bool = False, advice: str = ADVICE,
            what: str = "") -> Path:
    """Move the finished file or folder `tmp` to `final`, never over an existing one: a file by
    link(2) and unlink of `tmp`, a folder by renameat2(RENAME_NOREPLACE). An existing `final`
    raises OutputExists and `tmp` stays (with `unique`, the next free name is taken). Returns
    the path taken."""
    src = Path(tmp)
    is_dir = src.is_dir() and not src.is_symlink()
    for p in _claims(final, unique):
        try:
            if is_dir:
                rename_noreplace(src, p)
            else:
                os.link(src, p, follow_symlinks=False)
                src.unlink()
        except FileExistsError:
            if unique:
                continue
            raise OutputExists(p, advice, what) from None
        return p
    raise AssertionError("unreachable")
