"""The tiny benchmark's data: a real English corpus shipped in the repository, split into C4-format
shards, a sentencepiece tokenizer trained on it, and the indexed datasets configs/tiny_cpu.toml
names. `ensure_tiny_data(data_dir)` builds whatever is missing and is a no-op when all is there.

The corpus (`corpus/tiny_corpus.jsonl.xz`, ~3 MB) is section-level documents of the Python 3.11,
PostgreSQL 15 and SQLite documentation as packaged by Debian 12 (see docs/data.md and
corpus/LICENSES.md; scripts/build_tiny_corpus.py rebuilds it). Documents are ordered by the
SHA-1 of their text (mixing the three sources like C4's random shards), then cut by character count:
the first 1.5% is validation, the next 25.5% the pre-training shard of the tiny initial
checkpoint, and each remaining document goes to the lighter of the two training shards (en_6, en_7).
"""
from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import lzma
import os
import sys
import time
from pathlib import Path

from . import manifest as mf
from .errors import DataError
from .prepare import Output, describe, prepare
from .tokenizer import train_tokenizer
from .verify import verify_prepared

CORPUS = Path(__file__).resolve().parent / "corpus" / "tiny_corpus.jsonl.xz"
TOKENIZER = "tokenizer/tiny_sp.model"
VOCAB_SIZE = 4000
"""Tiny tokenizer vocab: a few thousand, below the tiny model's 4096 rows (like Mixtral's 32,000
below Llama's 128,256)."""
VALID_FRACTION = 0.015
PRETRAIN_FRACTION = 0.255
MIN_VALID_TOKENS = 64 * 256 + 1
"""tiny_llama31 eval_samples x seq_length + 1 (see config/rules.py TINY_LLAMA31)."""
STAMP = "tiny_data.json"
FORMAT = 2
"""2: documents without EOD, as the reference prepares its data; verification recorded."""

RAW = {  # raw C4-format shard -> dataset prefix
    "raw/c4-train.00000-of-00002.json.gz": "c4-train.en_6_text_document",
    "raw/c4-train.00001-of-00002.json.gz": "c4-train.en_7_text_document",
    "raw/c4-pretrain.00000-of-00001.json.gz": "c4-pretrain.en_text_document",
    "raw/c4-validation.00000-of-00001.json.gz": "c4-validation.en_text_document",
}


def corpus_documents(limit: int | None = None) -> list[dict]:
    """Documents of the shipped corpus in file order (`limit`: only the first ones)."""
    if not CORPUS.is_file():
        raise DataError(f"{CORPUS}: the shipped tiny corpus is missing; restore it from git "
                        "(`git checkout -- llama31_405b/data/corpus`) or rebuild it with "
                        "scripts/build_tiny_corpus.py")
    out = []
    with lzma.open(CORPUS, "rt", encoding="utf-8") as f:
        for line in f:
            out.append(json.loads(line))
            if limit is not None and len(out) >= limit:
                break
    return out


def split_corpus(docs: list[dict]) -> dict[str, list[dict]]:
    """Deterministic split into the four raw shards (keys of RAW)."""
    order = sorted(docs, key=lambda d: hashlib.sha1(d["text"].encode()).hexdigest())
    words = [len(d["text"]) for d in order]  # characters: a proxy for tokens
    total = sum(words)
    names = list(RAW)
    shards: dict[str, list[dict]] = {n: [] for n in names}
    seen = 0
    train_chars = [0, 0]
    for d, w in zip(order, words):
        if seen < VALID_FRACTION * total:
            shards[names[3]].append(d)
        elif seen < (VALID_FRACTION + PRETRAIN_FRACTION) * total:
            shards[names[2]].append(d)
        else:
            k = 0 if train_chars[0] <= train_chars[1] else 1  # keep en_6 and en_7 balanced
            shards[names[k]].append(d)
            train_chars[k] += w
        seen += w
    return shards


def _write_shard(path: Path, docs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        for d in docs:
            rec = {"text": d["text"], "timestamp": "2023-02-07T00:00:00Z",
                   "url": f"debian:{d['source']}/{d['url']}"}
            gz.write((json.dumps(rec, ensure_ascii=False) + "\n").encode())
    os.replace(tmp, path)


def _stamp_ok(data_dir: Path, corpus_sha: str, manifest: Path | None) -> bool:
    stamp = data_dir / STAMP
    try:
        s = json.loads(stamp.read_text())
        if s.get("format") != FORMAT or s.get("corpus_sha256") != corpus_sha:
            return False
        m = mf.load_manifest(data_dir, manifest)
        for key in [TOKENIZER] + [p + e for p in RAW.values() for e in (".bin", ".idx")]:
            mf.check_file(data_dir / key, m["files"][key], full=False, where=stamp)
        return all(m["datasets"][p].get("verified", {}).get("passed") for p in RAW.values())
    except (OSError, ValueError, KeyError):
        return False


def ensure_tiny_data(data_dir: str | Path, *, workers: int | None = None,
                     quiet: bool = False, manifest: str | Path | None = None) -> Path:
    """Make sure `data_dir` holds the tiny corpus, tokenizer and datasets; returns data_dir.
    `manifest`: the manifest file (a config's `data.manifest`; default DATA_DIR/manifest.json)."""
    data_dir = Path(data_dir)
    manifest = mf.manifest_path(data_dir, manifest)
    corpus_sha = mf.file_record(CORPUS)["sha256"] if CORPUS.is_file() else ""
    if corpus_sha and _stamp_ok(data_dir, corpus_sha, manifest):
        return data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / ".tiny_data.lock", "w") as lock:  # concurrent callers (pytest -n) wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if corpus_sha and _stamp_ok(data_dir, corpus_sha, manifest):
            return data_dir
        return _build(data_dir, corpus_sha, workers=workers, quiet=quiet, manifest=manifest)


def _build(data_dir: Path, corpus_sha: str, *, workers: int | None, quiet: bool,
           manifest: Path) -> Path:
    t0 = time.monotonic()
    say = (lambda msg: None) if quiet else (lambda msg: print(
        f"[{time.monotonic() - t0:5.1f} s] {msg}", file=sys.stderr, flush=True))
    say(f"tiny data: building in {data_dir} from {CORPUS.name}")
    shards = split_corpus(corpus_documents())
    for rel, docs in shards.items():
        _write_shard(data_dir / rel, docs)
    say(f"tiny data: wrote {len(shards)} C4-format shards "
        f"({', '.join(f'{len(d)}' for d in shards.values())} documents)")
    tok_path = data_dir / TOKENIZER
    train_texts = [d["text"] for name in list(RAW)[:2] for d in shards[name]]
    train_tokenizer(train_texts, tok_path, vocab_size=VOCAB_SIZE)
    with mf.updating(data_dir, manifest) as m:
        m["files"][TOKENIZER] = mf.file_record(tok_path)
        for rel in RAW:
            m["files"][rel] = mf.file_record(data_dir / rel)
    say(f"tiny data: trained {TOKENIZER} (BPE, {VOCAB_SIZE} pieces, byte fallback)")
    outputs = [Output(prefix=data_dir / prefix, inputs=(data_dir / rel,),
                      min_tokens=MIN_VALID_TOKENS if "validation" in prefix else None)
               for rel, prefix in RAW.items()]
    results = prepare(outputs, tok_path, data_dir=data_dir, workers=workers, progress=not quiet,
                      manifest=manifest)
    if not quiet:
        describe(results)
    verify_prepared(data_dir, tok_path, [data_dir / prefix for prefix in RAW.values()], manifest)
    say(f"tiny data: verified (recorded in {manifest})")
    stamp = data_dir / STAMP
    stamp.write_text(json.dumps({"format": FORMAT, "corpus_sha256": corpus_sha,
                                 "tokens": {r.prefix.name: r.tokens for r in results}}, indent=1))
    say("tiny data: ready")
    return data_dir
