"""Speed of the training loader's .bin reads: the project's pread reader with its stat check
(data.binfile.BinFile, what training uses) against megatron-core's memory-mapped reader
(`_MMapBinReader`, what training used before), on the same samples, in the same run.

usage: PYTHONPATH=. python bench/loader.py [--tokens 50_000_000] [--seq 8192] [--samples 2000]
                                           [--repeat 7] [--dir DIR]

Writes a synthetic indexed dataset (uint16 tokens, documents of C4-like lengths: log-normal,
median ~400 tokens) under --dir (default: a temporary folder), then reads `--samples` training
samples of seq+1 tokens at random document starts, each assembled as megatron-core 0.19.2's
`GPTDataset._query_document_sample_shuffle_indices` does (the rest of the first document from
an offset, then whole documents, the last one cut; one `IndexedDataset.get` per piece, the
pieces concatenated into an int64 array). Both readers go through `IndexedDataset.get`; the
file is in the page cache for both (a warm-up pass first), which is the worst case for pread's
extra copy and system call: from disk, both wait for the same I/O.

Prints, per round, both times; then the median ratio pread / mmap (time per sample: > 1 slower)
with its range, and the microseconds per sample of each. Rounds alternate the order of the two.
"""
from __future__ import annotations

import argparse
import os
import statistics
import struct
import tempfile
import time
from pathlib import Path

import numpy as np


def write_dataset(prefix: Path, tokens: int, seed: int = 0) -> int:
    """A Megatron indexed dataset of about `tokens` uint16 tokens; returns the document count."""
    rng = np.random.default_rng(seed)
    lengths = []
    total = 0
    while total < tokens:
        n = int(min(max(rng.lognormal(6.0, 1.0), 8), 20000))
        lengths.append(n)
        total += n
    lengths = np.array(lengths, dtype=np.int32)
    with open(f"{prefix}.bin", "wb") as f:
        left = int(lengths.sum())
        while left:
            n = min(left, 1 << 24)
            f.write(rng.integers(0, 32000, n, dtype=np.uint16).tobytes())
            left -= n
    pointers = np.zeros(len(lengths), dtype=np.int64)
    pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64) * 2)
    docs = np.arange(len(lengths) + 1, dtype=np.int64)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lengths), len(docs)))
        f.write(lengths.tobytes() + pointers.tobytes() + docs.tobytes())
    return len(lengths)


def sample_reader(ds, seq: int):
    """One training sample of seq+1 tokens starting at document `doc`, offset `offset`, read
    piece by piece as GPTDataset reads it."""
    lengths = ds.index.sequence_lengths

    def read(doc: int, offset: int) -> np.ndarray:
        parts, need = [], seq + 1
        while need > 0:
            take = min(int(lengths[doc]) - offset, need)
            parts.append(ds.get(doc, offset=offset, length=take))
            need -= take
            doc, offset = (doc + 1) % len(lengths), 0
        return np.array(np.concatenate(parts), dtype=np.int64)
    return read


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=50_000_000)
    ap.add_argument("--seq", type=int, default=8192, help="sequence length (tiny: 256)")
    ap.add_argument("--samples", type=int, default=2000, help="samples per timed pass")
    ap.add_argument("--repeat", type=int, default=7, help="rounds (each: both readers)")
    ap.add_argument("--dir", default=None, help="folder for the synthetic dataset")
    a = ap.parse_args()

    from megatron.core.datasets.indexed_dataset import IndexedDataset, _MMapBinReader

    from llama31_405b.data.datasets import _pread_bin_reader_class

    tmp = None if a.dir else tempfile.TemporaryDirectory(prefix="bench-loader-")
    root = Path(a.dir or tmp.name)
    root.mkdir(parents=True, exist_ok=True)
    prefix = root / "synthetic_text_document"
    t0 = time.perf_counter()
    ndocs = write_dataset(prefix, a.tokens)
    print(f"dataset: {ndocs} documents, {os.path.getsize(f'{prefix}.bin') / 1e6:.0f} MB "
          f"({time.perf_counter() - t0:.1f} s to write); {a.samples} samples of {a.seq + 1} "
          f"tokens per pass, {a.repeat} rounds")

    mmap_ds = IndexedDataset(str(prefix), mmap=False)
    mmap_ds.bin_reader = _MMapBinReader(f"{prefix}.bin")
    pread_ds = IndexedDataset(str(prefix), mmap=False)
    pread_ds.bin_reader = _pread_bin_reader_class()(f"{prefix}.bin")
    rng = np.random.default_rng(1)
    docs = rng.integers(0, ndocs, a.samples)
    offsets = [int(rng.integers(0, mmap_ds.index.sequence_lengths[d])) for d in docs]
    readers = {"mmap": sample_reader(mmap_ds, a.seq), "pread": sample_reader(pread_ds, a.seq)}

    def timed(name: str) -> float:
        read = readers[name]
        t = time.perf_counter()
        for d, o in zip(docs, offsets):
            read(int(d), o)
        return time.perf_counter() - t

    same = all(np.array_equal(readers["mmap"](int(d), o), readers["pread"](int(d), o))
               for d, o in zip(docs[:50], offsets[:50]))
    print(f"same tokens from both readers: {same}")
    for name in readers:      # warm-up: the file in the page cache, code paths hot
        timed(name)
    ratios, per = [], {"mmap": [], "pread": []}
    for r in range(a.repeat):
        order = ("mmap", "pread") if r % 2 == 0 else ("pread", "mmap")
        got = {name: timed(name) for name in order}
        for name in got:
            per[name].append(got[name])
        ratios.append(got["pread"] / got["mmap"])
        print(f"round {r + 1}: mmap {got['mmap']:.3f} s, pread {got['pread']:.3f} s, "
              f"ratio {ratios[-1]:.3f}")
    us = {k: 1e6 * min(v) / a.samples for k, v in per.items()}
    print(f"ratio pread / mmap (time per sample): median {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f}); best per sample: mmap {us['mmap']:.1f} "
          f"us, pread {us['pread']:.1f} us")
    if tmp is not None:
        tmp.cleanup()
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
