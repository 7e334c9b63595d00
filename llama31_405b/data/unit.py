"""The two sides of `data prepare`'s work (prepare.py runs them): `tokenize_block` in the worker
processes, `PartWriter` in the main process.

A unit is one part of one output (one input shard, or several consecutive small ones up to
GROUP_BYTES; the validation set's shards together): its part files `PART.bin/.idx` and the
`PART.json` record prepare's resume compares with `Unit.key()` (which names the unit's shards
and their sizes). The main process reads each unit's shards as blocks of whole lines (about
BLOCK_BYTES each, reader.BlockReader) and hands them to the worker pool, so every worker has work
until the last block, whatever the number and sizes of the shards. A worker parses the block's
JSON lines and tokenizes the texts (`tokenize_block`); the main process takes the results in
reading order and appends them to the unit's `PartWriter`, which writes the part as the
one-unit-per-shard implementation did: the same documents, skip counts, errors (file and line)
and bytes (tests/test_data_prepare_blocks.py).
"""
from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError
from .indexed import token_dtype
from .reader import SkipCounts, hint, parse_line
from .tokenizer import TOKENIZATION, SentencePieceTokenizer

BLOCK_BYTES = 1 << 19
"""Uncompressed bytes of a block of lines (~0.1 s of tokenization; C4 documents average ~2 KB)."""

GROUP_BYTES = 4 << 20
"""Input bytes (file sizes) of a unit made of several consecutive small shards of one output.
Each unit costs the main process a part (three files created, written, renamed, then merged and
deleted: ~3 ms of CPU, measured on the bench's 256 shards of ~37 KB json.gz, where that was 10%
of their tokenization); 4 MiB of json.gz is seconds of tokenization, so the cost vanishes, and
it bounds what a failing shard or an interruption makes a rerun redo beside the shard itself.
A shard of this size or more is a unit of its own, as every shard was before."""

GROUP_WINDOW = 64
"""Units never span a multiple of this many inputs: a shard whose size changes (a damaged shard
copied again) moves the unit boundaries of its own window of inputs only, and, parts being named
after their first shard, the parts of other windows are reused by the rerun."""


def group_inputs(sizes: list[int]) -> list[range]:
    """The units of an output (without max_docs) whose inputs have these sizes, as ranges of
    input indexes, in order: a shard of GROUP_BYTES or more alone; smaller consecutive ones
    together until they hold GROUP_BYTES, within windows of GROUP_WINDOW inputs."""
    units: list[range] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (i % GROUP_WINDOW == 0 or size >= GROUP_BYTES):
            units.append(range(start, i))
            start, total = i, 0
        total += size
        if total >= GROUP_BYTES:
            units.append(range(start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes):
        units.append(range(start, len(sizes)))
    return units


@dataclass(frozen=True)
class Unit:
    """One part of one output: its input shards, options and part files."""
    out: int
    part: int
    """Index of the unit's first input: parts are named and merged in this order."""
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


# ---------------------------------------------------------------- worker side
_TOK: SentencePieceTokenizer | None = None


def inherit_tokenizer(tok: SentencePieceTokenizer) -> None:
    """Set before a fork pool starts: its workers then use `tok` as it is loaded."""
    global _TOK
    _TOK = tok


def _tokenizer(path: str) -> SentencePieceTokenizer:
    global _TOK
    if _TOK is None or str(_TOK.path) != path:
        _TOK = SentencePieceTokenizer(path)
    return _TOK


@dataclass
class Block:
    """A tokenized block. Offsets are line numbers relative to the block's first line."""
    text_at: list[int]
    """Offset of each text (a non-empty "text"), in order."""
    lengths: list[int]
    """Tokens of each text's document (EOD included); 0: the text tokenized to nothing."""
    tokens: bytes
    """The documents' ids back to back, in the output dtype."""
    skips: list[tuple[int, str]]
    """(offset, SkipCounts field) of each line skipped: malformed, missing_text, empty."""
    error: tuple[int, str] | None
    """(offset, message without file and line) of the first bad line when not skipping; the
    block's texts before it are in the fields above, lines after it are not read."""


def tokenize_block(tokenizer: str, data: bytes, skip_bad: bool, append_eod: bool) -> Block:
    """Parse and tokenize one block of JSON lines (reader.BlockReader)."""
    tok = _tokenizer(tokenizer)
    lines = data.split(b"\n")
    ends_with_newline = data.endswith(b"\n")
    if ends_with_newline:
        lines.pop()
    texts, text_at, skips, error = [], [], [], None
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        text = parse_line(line)
        if isinstance(text, str):
            if text:
                texts.append(text)
                text_at.append(k)
            else:
                skips.append((k, "empty"))
            continue
        if skip_bad:
            skips.append((k, text[0]))
            continue
        if ends_with_newline or k < len(lines) - 1:  # the message as for the line read whole
            text = parse_line(line + b"\n")
        error = (k, f"{text[1]}{hint(skip_bad)}")
        break
    ids = tok.tokenize_batch(texts) if texts else []
    if append_eod:
        for d in ids:
            if d:
                d.append(tok.eod)
    lengths = [len(d) for d in ids]
    tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=token_dtype(tok.vocab_size),
                         count=sum(lengths))
    return Block(text_at, lengths, tokens.tobytes(), skips, error)


def tokenize_blocks(tokenizer: str, blocks: list[tuple[bytes, bool, bool]]) -> list[Block]:
    """`tokenize_block` of each (data, skip_bad, append_eod), in order: the blocks of small
    shards travel to a worker together, one task of about BLOCK_BYTES."""
    return [tokenize_block(tokenizer, *b) for b in blocks]


# ---------------------------------------------------------------- main side
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


class PartWriter:
    """Writes one unit's part from its blocks, taken in reading order. Raises DataError (file and
    line) where the unit fails; `abort` then removes what was written."""

    def __init__(self, u: Unit, vocab_size: int) -> None:
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
        self.u = u
        self.dtype = token_dtype(vocab_size)
        self.tmp_bin = Path(f"{u.part_prefix}.tmp.bin")
        self.tmp_idx = Path(f"{u.part_prefix}.tmp.idx")
        self.builder = IndexedDatasetBuilder(str(self.tmp_bin), dtype=self.dtype)
        self.docs = self.tokens = 0
        self.taken = 0  # texts read (the unit of max_docs)
        self.skipped = SkipCounts()
        self.shard = SkipCounts()  # the current shard's
        self.shard_texts = 0
        self.full = False  # max_docs reached: the rest of the inputs is not read

    def add(self, path: Path, first_line: int, b: Block) -> None:
        n, skips, error = len(b.lengths), b.skips, b.error
        if self.u.max_docs is not None and self.taken + n >= self.u.max_docs:
            n = self.u.max_docs - self.taken
            last = b.text_at[n - 1]
            skips = [s for s in skips if s[0] < last]
            error, self.full = None, True
        for _, kind in skips:
            setattr(self.shard, kind, getattr(self.shard, kind) + 1)
        lengths = b.lengths[:n]
        kept = [x for x in lengths if x]
        self.shard.empty += len(lengths) - len(kept)
        tokens = np.frombuffer(b.tokens, dtype=self.dtype, count=sum(kept))
        _add_documents(self.builder, tokens, kept)
        self.docs += len(kept)
        self.tokens += len(tokens)
        self.taken += n
        self.shard_texts += n
        if error is not None:
            raise DataError(f"{path}:{first_line + error[0]}: {error[1]}")

    def end_shard(self, path: Path, lines: int) -> None:
        """After the last block of `path` (or the block that reached max_docs)."""
        c, self.shard = self.shard, SkipCounts()
        self.skipped.add(c)
        if self.shard_texts == 0:
            raise DataError(f"{path}: empty shard (no documents in {lines} lines"
                            + (f"; skipped {c.malformed} malformed, {c.missing_text} without "
                               f"text, {c.empty} empty" if c.total() else "")
                            + "); remove it from the inputs or copy it again")
        self.shard_texts = 0

    def finish(self) -> dict:
        """Checks the document count, renames the part files, writes the record; returns it."""
        u = self.u
        if u.max_docs is not None and self.taken < u.max_docs:
            raise DataError(f"{', '.join(str(p) for p in u.inputs)}: only {self.taken} documents, "
                            f"{u.max_docs} requested; add the following shards to the inputs")
        self.builder.finalize(str(self.tmp_idx))
        os.replace(self.tmp_bin, f"{u.part_prefix}.bin")
        os.replace(self.tmp_idx, f"{u.part_prefix}.idx")
        s = self.skipped
        rec = {**u.key(), "documents": self.docs, "tokens": self.tokens,
               "skipped": {"malformed": s.malformed, "missing_text": s.missing_text,
                           "empty": s.empty}}
        marker = Path(f"{u.part_prefix}.json")
        marker.with_suffix(".json.tmp").write_text(json.dumps(rec))
        os.replace(marker.with_suffix(".json.tmp"), marker)
        return rec

    def abort(self) -> None:
        self.builder.data_file.close()
        self.tmp_bin.unlink(missing_ok=True)
        self.tmp_idx.unlink(missing_ok=True)
