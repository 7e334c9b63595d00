"""Structure of Megatron indexed datasets (`PREFIX.bin` + `PREFIX.idx`), read without Megatron.

The .idx layout (megatron-core's `_IndexWriter`): 9-byte magic `MMIDIDX\\0\\0`, version (u64 = 1),
dtype code (u8), sequence count S (u64), document-index count D (u64), then S int32 sequence
lengths, S int64 byte pointers into .bin, D int64 document indices (0 first, S last). The .bin
holds the tokens of all sequences back to back. Prepared C4 data has one sequence per document.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}
TOKEN_DTYPES = (np.uint16, np.int32)


def token_dtype(vocab_size: int):
    """Megatron's choice: uint16 while every id fits, int32 beyond."""
    return np.uint16 if vocab_size <= 65536 else np.int32


@dataclass(frozen=True)
class IndexInfo:
    prefix: str
    dtype: type
    sequences: int
    documents: int
    tokens: int
    bin_size: int
    idx_size: int
    max_sequence: int
    """Longest sequence (-1 when read with deep=False)."""


def read_index(prefix: str | Path, *, deep: bool = True) -> IndexInfo:
    """Check the .idx/.bin pair for internal consistency and return its shape.

    Raises DataError naming the file when anything disagrees (header, version, dtype, counts,
    file sizes, pointers, document indices). Only the .idx is read; of the .bin, its size.
    `deep=False` reads the 34-byte header and the last sequence's length and pointer only, and
    checks the counts against both file sizes and the .bin's size against where the last
    sequence ends: cheap on the multi-GB C4 index files, for code that runs on every rank (a
    truncated .bin is refused before run_start, with require_verified off too)."""
    prefix = str(prefix)
    idx, bin_ = Path(prefix + ".idx"), Path(prefix + ".bin")
    for p in (idx, bin_):
        if not p.is_file():
            raise DataError(f"{p}: missing (indexed datasets are PREFIX.bin + PREFIX.idx); "
                            "run `python -m llama31_405b data prepare` or copy the file there")
    idx_size, bin_size = idx.stat().st_size, bin_.stat().st_size
    with open(idx, "rb") as f:
        head = f.read(34)
    if len(head) < 34 or head[:9] != MAGIC:
        raise DataError(f"{idx}: not a Megatron index file (bad header); prepare it again")
    version, code, seqs, docs = struct.unpack("<QBQQ", head[9:34])
    if version != 1:
        raise DataError(f"{idx}: index version {version}, expected 1")
    if code not in DTYPES or DTYPES[code] not in TOKEN_DTYPES:
        raise DataError(f"{idx}: token dtype code {code} is not uint16 or int32")
    dtype = DTYPES[code]
    expected = 34 + seqs * (4 + 8) + docs * 8
    if idx_size not in (expected, expected + seqs):  # + int8 modes for multimodal data
        raise DataError(f"{idx}: {idx_size} bytes, but its header ({seqs} sequences, {docs} "
                        f"document indices) needs {expected}: the file is truncated or damaged")
    itemsize = np.dtype(dtype).itemsize
    if not deep:
        if bin_size % itemsize or docs < 1:
            raise DataError(f"{bin_}: {bin_size} bytes is not a whole number of "
                            f"{np.dtype(dtype).name} tokens, or {idx.name} has no document "
                            "index: the pair does not belong together or one file is damaged")
        need = _bin_end(idx, seqs, itemsize)
        if need != bin_size:
            raise DataError(f"{bin_}: {bin_size} bytes, but {idx.name} says its last sequence "
                            f"ends at byte {need}: the .bin is "
                            f"{'truncated' if bin_size < need else 'longer than its index'} or "
                            "the pair does not belong together; copy or prepare it again (then "
                            "`python -m llama31_405b data verify CONFIG`)")
        return IndexInfo(prefix=prefix, dtype=dtype, sequences=int(seqs), documents=int(docs - 1),
                         tokens=bin_size // itemsize, bin_size=bin_size, idx_size=idx_size,
                         max_sequence=-1)
    mm = np.memmap(idx, mode="r", dtype=np.uint8)
    lengths = np.frombuffer(mm, dtype=np.int32, count=seqs, offset=34)
    pointers = np.frombuffer(mm, dtype=np.int64, count=seqs, offset=34 + 4 * seqs)
    doc_idx = np.frombuffer(mm, dtype=np.int64, count=docs, offset=34 + 12 * seqs)
    tokens = int(lengths.sum(dtype=np.int64))
    if tokens * itemsize != bin_size:
        raise DataError(f"{bin_}: {bin_size} bytes, but {idx.name} describes {tokens} tokens of "
                        f"{np.dtype(dtype).name} = {tokens * itemsize} bytes: the pair does not "
                        "belong together or one file is truncated")
    if seqs and (pointers[0] != 0 or np.any(np.diff(pointers) != lengths[:-1].astype(np.int64)
                                            * itemsize)):
        raise DataError(f"{idx}: sequence pointers do not match the sequence lengths")
    if docs < 1 or doc_idx[0] != 0 or doc_idx[-1] != seqs or np.any(np.diff(doc_idx) < 0):
        raise DataError(f"{idx}: document indices are not 0 .. {seqs} in order")
    if seqs and lengths.min() < 1:
        raise DataError(f"{idx}: contains empty sequences")
    return IndexInfo(prefix=prefix, dtype=dtype, sequences=int(seqs), documents=int(docs - 1),
                     tokens=tokens, bin_size=bin_size, idx_size=idx_size,
                     max_sequence=int(lengths.max()) if seqs else 0)


def _bin_end(idx: Path, seqs: int, itemsize: int) -> int:
    """Where the .bin must end by the .idx: the last sequence's pointer plus its length (12
    bytes of the index, read without mapping it: metadata, allowed before run_start)."""
    if not seqs:
        return 0
    with open(idx, "rb") as f:
        length = np.frombuffer(os.pread(f.fileno(), 4, 34 + 4 * (seqs - 1)), dtype=np.int32)
        pointer = np.frombuffer(os.pread(f.fileno(), 8, 34 + 4 * seqs + 8 * (seqs - 1)),
                                dtype=np.int64)
    return int(pointer[0]) + int(length[0]) * itemsize


def token_stream(info: IndexInfo) -> np.ndarray:
    """The .bin file as one read-only token array (documents back to back). Maps the .bin:
    never call it before run_start."""
    return np.memmap(info.prefix + ".bin", mode="r", dtype=info.dtype)


def _read_tokens(info: IndexInfo, start: int, count: int) -> np.ndarray:
    """Tokens [start, start+count) of the .bin, read (not mapped: a file that shrinks under the
    reader gives a DataError naming it, not SIGBUS)."""
    from .binfile import BinFile
    return BinFile(info.prefix + ".bin").read(info.dtype, count,
                                              start * np.dtype(info.dtype).itemsize)


def last_tokens(info: IndexInfo, n: int) -> np.ndarray:
    """The last token of each of the first n sequences (reads the .bin)."""
    n = min(n, info.sequences)
    if not n:
        return np.zeros(0, dtype=info.dtype)
    lengths = np.fromfile(info.prefix + ".idx", dtype=np.int32, count=n, offset=34)
    ends = np.cumsum(lengths.astype(np.int64)) - 1
    from .binfile import BinFile
    f = BinFile(info.prefix + ".bin")
    itemsize = np.dtype(info.dtype).itemsize
    try:
        return np.concatenate([f.read(info.dtype, 1, int(e) * itemsize) for e in ends])
    finally:
        f.close()


def max_token_id(info: IndexInfo, *, scan_all: bool, block: int = 1 << 26,
                 samples: int = 16) -> tuple[int, str]:
    """(largest id found, what was scanned): every token when `scan_all` or the file holds at
    most `block` tokens, else `samples` blocks of block/16 tokens spread over the file."""
    if not info.tokens:
        return -1, "all (empty)"
    if scan_all or info.tokens <= block:
        spans = [(a, min(a + block, info.tokens)) for a in range(0, info.tokens, block)]
        how = "all"
    else:
        size = block // 16
        step = (info.tokens - size) // (samples - 1)
        spans = [(i * step, i * step + size) for i in range(samples)]
        how = f"{samples} blocks of {size} tokens"
    return max(int(_read_tokens(info, a, b - a).max()) for a, b in spans), how
