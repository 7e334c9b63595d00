"""The manifest: `DATA_DIR/manifest.json` records size and checksums of every prepared or
accepted file, and what each dataset holds.

    {"version": 1,
     "files":    {"c4-train.en_6_text_document.bin": {"size": ..., "sha256": ..., "sample_sha256": ...}},
     "datasets": {"c4-train.en_6_text_document": {"origin": "prepared" | "accepted", "documents": ...,
                  "tokens": ..., "dtype": "uint16", "tokenizer_sha256": ..., "sources": [...]}}}

`sha256` hashes the whole file (`data verify --full`); `sample_sha256` hashes the size plus 24
spread-out blocks (first and last 4 MiB, 16 x 64 KiB between), which catches truncation,
replacement and most damage in a second even on the multi-GB C4 files: training checks that one.
Paths are relative to DATA_DIR. Written atomically (temporary name, then rename) under a lock
file beside it. The file can live outside DATA_DIR (`data.manifest`, for data on a read-only
mount): every function takes the data folder and, optionally, the manifest's own path.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

from .errors import DataError
from .tokenizer import file_sha256

NAME = "manifest.json"
_EDGE = 4 << 20
_BLOCK = 64 << 10
_SPREAD = 16


def manifest_path(data_dir: str | Path, path: str | Path | None = None) -> Path:
    """`path` when given, else DATA_DIR/manifest.json."""
    return Path(path) if path is not None else Path(data_dir) / NAME


def sample_sha256(path: str | Path) -> str:
    size = os.path.getsize(path)
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= 2 * _EDGE + _SPREAD * _BLOCK:
            h.update(f.read())
        else:
            h.update(f.read(_EDGE))
            step = (size - 2 * _EDGE) // (_SPREAD + 1)
            for i in range(1, _SPREAD + 1):
                f.seek(_EDGE + i * step)
                h.update(f.read(_BLOCK))
            f.seek(size - _EDGE)
            h.update(f.read(_EDGE))
    return h.hexdigest()


def file_record(path: str | Path, *, full: bool = True) -> dict:
    rec = {"size": os.path.getsize(path), "sample_sha256": sample_sha256(path)}
    if full:
        rec["sha256"] = file_sha256(path)
    return rec


def check_file(path: Path, rec: dict, *, full: bool, where: Path,
               fix: str = "python -m llama31_405b data verify CONFIG --write-manifest") -> None:
    """Raise DataError when `path` does not match its manifest record; `fix`: the command that
    records the file as it is now (suggested for when the new file is right)."""
    fix = (f"the file changed since {where} was written: copy or prepare it again (or, if the new "
           f"file is right, run `{fix}`)")
    size = path.stat().st_size
    if size != rec.get("size"):
        raise DataError(f"{path}: size {size} bytes, manifest says {rec.get('size')}; {fix}")
    if rec.get("sample_sha256") and sample_sha256(path) != rec["sample_sha256"]:
        raise DataError(f"{path}: sampled checksum mismatch; {fix}")
    if full and rec.get("sha256") and file_sha256(path) != rec["sha256"]:
        raise DataError(f"{path}: sha256 mismatch; {fix}")


def load_manifest(data_dir: str | Path, path: str | Path | None = None) -> dict:
    p = manifest_path(data_dir, path)
    if not p.is_file():
        return {"version": 1, "files": {}, "datasets": {}}
    try:
        m = json.loads(p.read_text())
    except ValueError as e:
        raise DataError(f"{p}: not valid JSON ({e}); delete it and run `data verify "
                        "--write-manifest` or `data prepare` again") from None
    if not isinstance(m, dict) or m.get("version") != 1:
        raise DataError(f"{p}: unknown manifest format (expected version 1)")
    m.setdefault("files", {})
    m.setdefault("datasets", {})
    return m


@contextlib.contextmanager
def updating(data_dir: str | Path, path: str | Path | None = None) -> Iterator[dict]:
    """Lock, load, let the caller edit, write atomically."""
    p = manifest_path(data_dir, path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p.with_name(p.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        m = load_manifest(data_dir, p)
        yield m
        tmp = p.with_name(f"{p.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, p)


def rel(path: str | Path, data_dir: str | Path) -> str:
    return os.path.relpath(os.path.abspath(path), os.path.abspath(data_dir)).replace(os.sep, "/")
