#!/usr/bin/env python3
"""Fetch the Python sources of Transformer Engine 2.20.2 for the type check (`make typecheck`).

Transformer Engine is never installed on the CPU (it breaks Megatron's local layer spec), yet
the type check needs its Python sources to check every call into it. The `transformer-engine`
2.20.2 wheel on PyPI (transformer_engine-2.20.2-py3-none-any.whl, 1.2 MB) carries all of them:
`transformer_engine/{common,pytorch,jax,debug}/**.py`, 222 files; the CUDA library and the
torch C extension come in the separate transformer-engine-cu12/-cu13 and -torch packages,
which the check does not need. This script, idempotent and safe in a fresh clone:

1. returns at once when `.cache/te-2.20.2/` holds a complete extraction (its SOURCE file names
   the wheel's SHA-256 pinned below);
2. otherwise downloads the wheel with pip (`pip download --no-deps --only-binary=:all:`) into
   a temporary folder, checks its SHA-256 against WHEEL_SHA256 and its file count, extracts
   only the `.py` files into a temporary folder beside the cache, writes SOURCE, renames it into
   place (a crash leaves no half-filled cache), and deletes the wheel.

Exit 0 on success, 2 with one `error:` line naming what failed and what to do.
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path, PurePosixPath

VERSION = "2.20.2"
WHEEL = f"transformer_engine-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "7dcfad943a1a55b2612db9a0e43697fe98c70f4c42ec391ba3a0f872f6ce2094"
PY_FILES = 222
REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / f"te-{VERSION}"


class FetchError(Exception):
    pass


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_complete(dest: Path, digest: str = WHEEL_SHA256) -> bool:
    """True when `dest` holds an extraction of the wheel whose SHA-256 is `digest`."""
    source = dest / "SOURCE"
    return source.is_file() and f"sha256 {digest}" in source.read_text().splitlines()


def download(into: Path) -> Path:
    """The pinned wheel, downloaded by pip into folder `into`."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(into),
           f"transformer-engine=={VERSION}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    wheel = into / WHEEL
    if r.returncode != 0 or not wheel.is_file():
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise FetchError(f"pip could not download {WHEEL} (exit {r.returncode}: "
                         f"{' | '.join(tail) or 'no output'}); check that PyPI is reachable "
                         "and run `make typecheck` again")
    return wheel


def extract_py(wheel: Path, dest: Path, digest: str = WHEEL_SHA256,
               expected_files: int = PY_FILES) -> int:
    """Check `wheel`'s SHA-256 against `digest`, then extract its `transformer_engine/**.py`
    files into `dest` (which must not exist yet) through a temporary sibling folder. Returns the
    number of files extracted."""
    got = sha256(wheel)
    if got != digest:
        raise FetchError(f"{wheel}: SHA-256 {got} differs from the pinned {digest} "
                         f"(scripts/fetch_te_sources.py WHEEL_SHA256): the download is corrupt "
                         "or not the 2.20.2 release; delete it and run `make typecheck` again")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".partial-", dir=dest.parent))
    try:
        n = 0
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                p = PurePosixPath(name)
                if p.suffix != ".py" or p.parts[0] != "transformer_engine":
                    continue
                if p.is_absolute() or ".." in p.parts:
                    raise FetchError(f"{wheel}: member {name!r} leaves the extraction folder; "
                                     "refusing the wheel")
                out = tmp.joinpath(*p.parts)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(name))
                n += 1
        if n != expected_files:
            raise FetchError(f"{wheel}: {n} transformer_engine/*.py files, expected "
                             f"{expected_files} (scripts/fetch_te_sources.py PY_FILES): not "
                             "the wheel the type check was set up for")
        (tmp / "SOURCE").write_text(f"{wheel.name}\nsha256 {digest}\nfiles {n}\n")
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return n


def fetch(dest: Path = CACHE) -> str:
    """Make `dest` hold the sources; returns a one-line account of what was done."""
    if is_complete(dest):
        return f"Transformer Engine {VERSION} sources: cached in {dest}"
    if dest.exists():   # an extraction of another wheel, or one from an older script
        shutil.rmtree(dest)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="te-wheel-") as d:
        wheel = download(Path(d))
        size = wheel.stat().st_size
        n = extract_py(wheel, dest)
    # the temporary folder, and with it the wheel, is gone here
    py_bytes = sum(p.stat().st_size for p in dest.rglob("*.py"))
    return (f"Transformer Engine {VERSION} sources: fetched {WHEEL} ({size / 1e6:.1f} MB) and "
            f"kept its {n} .py files ({py_bytes / 1e6:.1f} MB) in {dest}, "
            f"{time.monotonic() - t0:.1f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=CACHE, help=f"default: {CACHE}")
    args = ap.parse_args(argv)
    try:
        print(fetch(args.dest), flush=True)
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
