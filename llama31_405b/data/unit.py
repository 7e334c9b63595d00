"""One work unit of `data prepare` (prepare.py): the input shards of one part of one output,
tokenized in a worker process into `PART.tmp.bin/.idx`, renamed to `PART.bin/.idx`, then marked
done by `PART.json` (the record prepare's resume compares with `Unit.key()`).

Documents go to megatron-core's `IndexedDatasetBuilder` in batches of BATCH_DOCS: one tokenizer
call, one numpy conversion and one write per batch. Progress goes to the parent through the
queue `init_worker` receives (out, part, documents, tokens, input bytes done).
"""
from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError
from .indexed import token_dtype
from .reader import ShardReader, SkipCounts
from .tokenizer import TOKENIZATION, SentencePieceTokenizer

BATCH_DOCS = 256
REPORT_EVERY_S = 0.5


@dataclass(frozen=True)
class Unit:
    """One part of one output: its input shards, options and part files."""
    out: int
    part: int
    inputs: tuple[Path, ...]
    max_docs: int | None
    skip_bad: bool
    tokenizer: str
    tokenizer_sha256: str
    part_prefix: Path
    append_eod: bool = False

    def key(self) -> dict:
        return {"inputs": [[p.name, p.stat().st_size] for p in self.inputs],
                "max_docs": self.max_docs, "skip_bad": self.skip_bad,
                "tokenizer_sha256": self.tokenizer_sha256, "append_eod": self.append_eod,
                "tokenization": TOKENIZATION}

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.inputs)


_TOK: SentencePieceTokenizer | None = None
_QUEUE = None


def init_worker(q) -> None:
    global _QUEUE
    _QUEUE = q


def inherit_tokenizer(tok: SentencePieceTokenizer) -> None:
    """Set before a fork pool starts: its workers then use `tok` as it is loaded."""
    global _TOK
    _TOK = tok


def _tokenizer(path: str) -> SentencePieceTokenizer:
    global _TOK
    if _TOK is None or str(_TOK.path) != path:
        _TOK = SentencePieceTokenizer(path)
    return _TOK


def _add_documents(builder, tokens: np.ndarray, lengths: list[int]) -> None:
    """Documents of one sequence each, back to back in `tokens`, in one write: what
    megatron-core 0.19.2's `IndexedDatasetBuilder.add_document(ids, [len(ids)])` records for each
    (tokens to `data_file`, the length to `sequence_lengths`, the sequence count to
    `document_indices`) without a numpy conversion and a write per document. Byte-identical
    output: tests/test_data_prepare.py compares with the builder's own for both token dtypes,
    tests/test_data_verify.py whole prepared files with reference-style ones."""
    builder.data_file.write(tokens.tobytes())
    start = len(builder.sequence_lengths)
    builder.sequence_lengths.extend(lengths)
    builder.document_indices.extend(range(start + 1, start + 1 + len(lengths)))


def run_unit(u: Unit, report=None) -> dict:
    """Tokenize one unit into its part files; returns the part's marker record."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    report = report or (lambda *a: _QUEUE.put(a) if _QUEUE is not None else None)
    tok = _tokenizer(u.tokenizer)
    dtype = token_dtype(tok.vocab_size)
    eod = tok.eod
    tmp_bin, tmp_idx = (Path(f"{u.part_prefix}.tmp.bin"), Path(f"{u.part_prefix}.tmp.idx"))
    builder = IndexedDatasetBuilder(str(tmp_bin), dtype=dtype)
    docs = tokens = 0
    skipped = SkipCounts()
    done_before = 0
    last = time.monotonic()
    batch: list[str] = []

    def flush() -> None:
        nonlocal docs, tokens
        kept = []
        for ids in tok.tokenize_batch(batch):
            if not ids:
                skipped.empty += 1
                continue
            if u.append_eod:
                ids.append(eod)
            kept.append(ids)
        lengths = [len(ids) for ids in kept]
        n = sum(lengths)
        _add_documents(builder, np.fromiter(itertools.chain.from_iterable(kept), dtype=dtype,
                                            count=n), lengths)
        docs += len(kept)
        tokens += n
        batch.clear()

    taken = 0  # texts read (the unit of max_docs)

    def fail(msg: str) -> None:
        builder.data_file.close()
        tmp_bin.unlink(missing_ok=True)
        raise DataError(msg)

    for path in u.inputs:
        reader = ShardReader(path, skip_bad=u.skip_bad)
        n_texts = 0
        for text in reader:
            batch.append(text)
            n_texts += 1
            taken += 1
            if taken == u.max_docs:
                break
            if len(batch) >= BATCH_DOCS:
                flush()
                now = time.monotonic()
                if now - last >= REPORT_EVERY_S:
                    last = now
                    report(u.out, u.part, docs, tokens, done_before + reader.position)
        flush()
        skipped.add(reader.counts)
        if n_texts == 0:
            c = reader.counts
            fail(f"{path}: empty shard (no documents in {reader.lines} lines"
                 + (f"; skipped {c.malformed} malformed, {c.missing_text} without text, "
                    f"{c.empty} empty" if c.total() else "")
                 + "); remove it from the inputs or copy it again")
        done_before += path.stat().st_size
        if taken == u.max_docs:
            break
    if u.max_docs is not None and taken < u.max_docs:
        fail(f"{', '.join(str(p) for p in u.inputs)}: only {taken} documents, {u.max_docs} "
             "requested; add the following shards to the inputs")
    builder.finalize(str(tmp_idx))
    os.replace(tmp_bin, f"{u.part_prefix}.bin")
    os.replace(tmp_idx, f"{u.part_prefix}.idx")
    rec = {**u.key(), "documents": docs, "tokens": tokens,
           "skipped": {"malformed": skipped.malformed, "missing_text": skipped.missing_text,
                       "empty": skipped.empty}}
    marker = Path(f"{u.part_prefix}.json")
    marker.with_suffix(".json.tmp").write_text(json.dumps(rec))
    os.replace(marker.with_suffix(".json.tmp"), marker)
    report(u.out, u.part, docs, tokens, done_before)
    return rec
