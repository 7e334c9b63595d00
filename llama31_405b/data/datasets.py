"""Training and validation datasets from the prepared files.

Training: megatron-core's blended GPTDataset over `data.train_prefixes` with `data.train_weights`
(the benchmark: en_6 and en_7, 50/50), `train_samples` sequences of `model.seq_length`, shuffled
with the run's seed. Its document/sample/shuffle index caches are built here (rank 0 first, the
other ranks wait on a barrier when torch.distributed is initialised; that is megatron-core's
builder) under `data.index_cache_dir`, so call this before run_start.

No .bin is opened here (MLPerf: nothing touches the dataset before run_start; the .idx metadata
and the files' stat may be read), and none is ever memory-mapped: megatron-core 0.19.2's
`IndexedDataset` maps its .bin in its constructor when `GPTDatasetConfig.mmap_bin_files` is true
(`_MMapBinReader`), and opens it at every read when false (`_FileBinReader`); so the blend is
built with mmap_bin_files=False and each IndexedDataset then gets a `PreadBinReader`
(data.binfile.BinFile: pread at the first read, once per process, and a stat check before every
read; the same reader checks the stat of the dataset's .idx at the same interval), as does the
validation set. A .bin or .idx changed or shrunk under the run is then a DataError naming it,
where a mapped file that shrank killed the process with SIGBUS. The .idx arrays a read needs,
which megatron-core keeps as views of a map of the .idx, come instead from one read-only copy
per node in shared memory (data.index_share: why that closes the SIGBUS window, and what it
costs). (A pickled copy, e.g. in a DataLoader worker, gets megatron's `_FileBinReader` and its
map of the .idx back from `IndexedDataset.__setstate__`: lazy, unchecked; the project's loader
is a thread, train.prefetch.)

Validation: the validation file's documents concatenated in order and cut
into exactly `eval_samples` sequences: sample i is tokens [i*S, (i+1)*S) with labels shifted by
one, S = seq_length. Not shuffled, no padding; the same dict as GPTDataset (tokens, labels,
loss_mask, position_ids; no attention mask, the model builds the causal mask).
"""
from __future__ import annotations

import numpy as np
import torch

from .binfile import BinFile, FileStamp, changed_error
from .errors import DataError
from .indexed import read_index
from .layout import data_paths, min_valid_tokens
from .tokenizer import load_tokenizer


class PackedValidationDataset(torch.utils.data.Dataset):
    """`num_samples` consecutive sequences of `seq_length` tokens from one indexed dataset."""

    def __init__(self, prefix: str, *, num_samples: int, seq_length: int,
                 stamp: FileStamp | None = None) -> None:
        self.info = read_index(prefix, deep=False)
        self.num_samples, self.seq_length = num_samples, seq_length
        need = num_samples * seq_length + 1
        if self.info.tokens < need:
            raise DataError(f"{prefix}.bin: {self.info.tokens} tokens, {num_samples} sequences of "
                            f"{seq_length} need {need}; prepare more validation documents")
        self._bin = BinFile(f"{prefix}.bin", stamp)   # opened at the first item
        self._loss_mask = torch.ones(seq_length, dtype=torch.float)
        self._position_ids = torch.arange(seq_length, dtype=torch.long)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < self.num_samples:
            raise IndexError(f"validation sample {i} out of range 0..{self.num_samples - 1}")
        s = self.seq_length
        itemsize = np.dtype(self.info.dtype).itemsize
        text = torch.from_numpy(self._bin.read(self.info.dtype, s + 1, i * s * itemsize)
                                .astype(np.int64))
        return {"tokens": text[:-1].contiguous(), "labels": text[1:].contiguous(),
                "loss_mask": self._loss_mask.clone(), "position_ids": self._position_ids.clone()}


def gpt_dataset_config(cfg, *, seed: int, tokenizer=None):
    """megatron-core's GPTDatasetConfig for the training blend (no split: all of each file)."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    p = data_paths(cfg)
    if len(p.train) != len(p.weights):
        raise DataError(f"data.train_weights has {len(p.weights)} entries for "
                        f"{len(p.train)} data.train_prefixes")
    tok = tokenizer or load_tokenizer(p.tokenizer)
    # megatron-core 0.19.2 types the tokenizer MegatronTokenizerBase but reads only vocab_size,
    # eod, eos and pad of it (GPTDatasetConfig.__post_init__, GPTDataset, MegatronDataset), which
    # data.tokenizer.SentencePieceTokenizer has
    return GPTDatasetConfig(
        random_seed=seed, sequence_length=cfg.model.seq_length,
        blend_per_split=[([str(x) for x in p.train], list(p.weights)), None, None],
        path_to_cache=str(p.index_cache), tokenizer=tok,  # type: ignore[arg-type]
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False, mmap_bin_files=False)


def _pread_bin_reader_class():
    from megatron.core.datasets.indexed_dataset import _BinReader

    class PreadBinReader(BinFile, _BinReader):
        """data.binfile.BinFile (pread, opened at the first read, the file's stat checked) as
        megatron-core's `_BinReader`: `read(dtype, count, offset)`; with `idx` (a BinFile of
        the dataset's .idx, never read), that file's stat is checked at the same interval."""
        idx: BinFile | None = None

        def read(self, dtype, count: int, offset: int) -> np.ndarray:
            if self.idx is not None:
                self.idx._check()   # a DataError naming the .idx when it changed
            return super().read(dtype, count, offset)

    return PreadBinReader


def indexed_datasets(ds) -> list:
    """The megatron-core IndexedDatasets under a blended or GPT dataset."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    if isinstance(ds, IndexedDataset):
        return [ds]
    out = []
    for child in getattr(ds, "datasets", None) or [getattr(ds, "dataset", None)]:
        if child is not None:
            out += indexed_datasets(child)
    return out


def make_bin_reads_checked(ds, stamps: dict[str, FileStamp] | None = None) -> list:
    """Give every IndexedDataset under `ds` a reader that preads its .bin from the first read
    on and checks before each read that the .bin and the .idx still match `stamps[path]`
    (default: their stat now), and the .idx arrays a read needs from its node's shared copy
    (data.index_share; every process of the job calls this: it has collectives). Returns the
    index_share.SharedIndex of each."""
    from megatron.core.datasets.indexed_dataset import get_bin_path, get_idx_path

    from . import index_share
    reader = _pread_bin_reader_class()
    stamps = dict(stamps or {})
    found = indexed_datasets(ds)
    for ix in found:
        path, idx = get_bin_path(ix.path_prefix), get_idx_path(ix.path_prefix)
        ix.bin_reader = reader(path, stamps.get(path))  # BinFile(path, stamp)
        stamps.setdefault(idx, FileStamp.of(idx))
        ix.bin_reader.idx = BinFile(idx, stamps[idx])
    shared = index_share.share(found, stamps, shm_dir=index_share.SHM_DIR)
    index_share.release(shared)
    return shared


def bin_stamps(cfg, verified: dict | None = None) -> dict[str, FileStamp]:
    """The stat of every .bin and .idx the run reads, taken now (before run_start); with
    `verified` (require_verified's records by manifest key), a file whose size or mtime differs
    from its verification is refused here, naming it."""
    from .manifest import rel
    p = data_paths(cfg)
    out = {}
    for prefix in (*p.train, p.valid):
        for ext in (".bin", ".idx"):
            path = f"{prefix}{ext}"
            stamp = out[path] = FileStamp.of(path)
            rec = ((verified or {}).get(rel(prefix, p.data_dir)) or {}).get("files", {}).get(ext)
            if rec:
                what = [f"size {rec.get('size')} -> {stamp.size} bytes"] * (
                    rec.get("size") != stamp.size)
                what += ["modified (mtime changed)"] * (rec.get("mtime_ns") != stamp.mtime_ns)
                if what:
                    raise changed_error(path, what, "its verification")
    return out


def build_datasets(cfg, *, seed: int, train_samples: int, verified: dict | None = None):
    """(train_ds, valid_ds): the blended training set and the packed validation set. Their
    reads check the .bin and .idx files against their stat before the build (and, with
    `verified`, the verification's record of them; see bin_stamps)."""
    import logging

    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder)
    from megatron.core.datasets.gpt_dataset import GPTDataset
    if train_samples < 1:
        raise DataError(f"train_samples must be >= 1, got {train_samples}")
    p = data_paths(cfg)
    for prefix in (*p.train, p.valid):
        read_index(prefix, deep=False)  # clear error before megatron's asserts
    stamps = bin_stamps(cfg, verified)  # before megatron-core reads the .idx files
    p.index_cache.mkdir(parents=True, exist_ok=True)
    gcfg = gpt_dataset_config(cfg, seed=seed)
    quiet = logging.getLogger("megatron.core.datasets")
    level = quiet.level
    quiet.setLevel(max(level, logging.WARNING))
    try:
        # sizes: megatron-core 0.19.2 annotates List[int], yet reads None as "no such split"
        # (BlendedMegatronDatasetBuilder.__init__ and build test sizes[i] is None)
        train, _, _ = BlendedMegatronDatasetBuilder(
            GPTDataset, [train_samples, None, None],  # type: ignore[list-item]
            lambda: True, gcfg).build()
    finally:
        quiet.setLevel(level)
    if train is None or len(train) < train_samples:
        raise DataError(f"training blend built {0 if train is None else len(train)} samples, "
                        f"{train_samples} requested")
    make_bin_reads_checked(train, stamps)
    valid = PackedValidationDataset(str(p.valid), num_samples=cfg.derived.eval_samples,
                                    seq_length=cfg.model.seq_length,
                                    stamp=stamps[f"{p.valid}.bin"])
    assert min_valid_tokens(cfg) <= valid.info.tokens
    return train, valid
