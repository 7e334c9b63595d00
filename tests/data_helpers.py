"""Small real fixtures for the data tests: documents of the shipped corpus, a small sentencepiece
model trained on them, C4-format shards (good and deliberately broken)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from llama31_405b.data.tiny import corpus_documents
from llama31_405b.data.tokenizer import train_tokenizer

N_DOCS = 240


def texts(n: int = N_DOCS) -> list[str]:
    return [d["text"] for d in corpus_documents(limit=n)]


def make_tokenizer(path: Path, docs: list[str], vocab_size: int = 600) -> Path:
    return train_tokenizer(docs, path, vocab_size=vocab_size)


def write_shard(path: Path, docs: list[str], *, extra_lines: list[str] = (), at: int = 0,
                gz: bool = True) -> Path:
    """A C4-format shard; `extra_lines` (raw text) are inserted before document `at`."""
    lines = [json.dumps({"text": t, "timestamp": "2019-04-25T00:00:00Z", "url": f"u{i}"})
             for i, t in enumerate(docs)]
    lines[at:at] = list(extra_lines)
    data = ("\n".join(lines) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                    mtime=0) as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def truncate(path: Path, keep: float = 0.6) -> Path:
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])
    return path
