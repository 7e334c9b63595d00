"""Training and validation datasets from the prepared files.

Training: megatron-core's blended GPTDataset over `data.train_prefixes` with `data.train_weights`
(the benchmark: en_6 and en_7, 50/50), `train_samples` sequences of `model.seq_length`, shuffled
with the run's seed. Its document/sample/shuffle index caches are built here (rank 0 first, the
other ranks wait on a barrier when torch.distributed is initialised; that is megatron-core's
builder) under `data.index_cache_dir`, so call this before run_start.

No .bin is opened or memory-mapped here (MLPerf: nothing touches the dataset before run_start;
the .idx metadata may be read). megatron-core 0.19.2's `IndexedDataset` maps its .bin in its
constructor when `GPTDatasetConfig.mmap_bin_files` is true (`_MMapBinReader`), and opens it at
every read when false (`_FileBinReader`); so the blend is built with mmap_bin_files=False and each
IndexedDataset then gets a `LazyMMapBinReader`, which maps the .bin at its first read, once per
process (a pickled copy, e.g. in a DataLoader worker, gets megatron's `_FileBinReader` back from
`IndexedDataset.__setstate__`: lazy too). The validation set maps its .bin at its first item.

Validation: the validation file's documents concatenated in order and cut
into exactly `eval_samples` sequences: sample i is tokens [i*S, (i+1)*S) with labels shifted by
one, S = seq_length. Not shuffled, no padding; the same dict as GPTDataset (tokens, labels,
loss_mask, position_ids; no attention mask, the model builds the causal mask).
"""
from __future__ import annotations

import numpy as np
import torch

from .errors import DataError
from .indexed import read_index, token_stream
from .layout import data_paths, min_valid_tokens
from .tokenizer import load_tokenizer


class PackedValidationDataset(torch.utils.data.Dataset):
    """`num_samples` consecutive sequences of `seq_length` tokens from one indexed dataset."""

    def __init__(self, prefix: str, *, num_samples: int, seq_length: int) -> None:
        self.info = read_index(prefix, deep=False)
        self.num_samples, self.seq_length = num_samples, seq_length
        need = num_samples * seq_length + 1
        if self.info.tokens < need:
            raise DataError(f"{prefix}.bin: {self.info.tokens} tokens, {num_samples} sequences of "
                            f"{seq_length} need {need}; prepare more validation documents")
        self._stream = None
        self._loss_mask = torch.ones(seq_length, dtype=torch.float)
        self._position_ids = torch.arange(seq_length, dtype=torch.long)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < self.num_samples:
            raise IndexError(f"validation sample {i} out of range 0..{self.num_samples - 1}")
        if self._stream is None:  # opened lazily: DataLoader workers each map the file
            self._stream = token_stream(self.info)
        s = self.seq_length
        text = torch.from_numpy(np.asarray(self._stream[i * s:(i + 1) * s + 1], dtype=np.int64))
        return {"tokens": text[:-1].contiguous(), "labels": text[1:].contiguous(),
                "loss_mask": self._loss_mask.clone(), "position_ids": self._position_ids.clone()}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_stream"] = None
        return state


def gpt_dataset_config(cfg, *, seed: int, tokenizer=None):
    """megatron-core's GPTDatasetConfig for the training blend (no split: all of each file)."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    p = data_paths(cfg)
    if len(p.train) != len(p.weights):
        raise DataError(f"data.train_weights has {len(p.weights)} entries for "
                        f"{len(p.train)} data.train_prefixes")
    tok = tokenizer or load_tokenizer(p.tokenizer)
    return GPTDatasetConfig(
        random_seed=seed, sequence_length=cfg.model.seq_length,
        blend_per_split=[([str(x) for x in p.train], list(p.weights)), None, None],
        path_to_cache=str(p.index_cache), tokenizer=tok,
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False, mmap_bin_files=False)


def _lazy_bin_reader_class():
    from megatron.core.datasets.indexed_dataset import _BinReader, _MMapBinReader

    class LazyMMapBinReader(_BinReader):
        """megatron-core's `_MMapBinReader`, created at the first read instead of up front."""

        def __init__(self, bin_path: str) -> None:
            self.bin_path = bin_path
            self._reader = None

        def read(self, dtype, count: int, offset: int) -> np.ndarray:
            if self._reader is None:
                self._reader = _MMapBinReader(self.bin_path)
            return self._reader.read(dtype, count, offset)

    return LazyMMapBinReader


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


def make_bin_reads_lazy(ds) -> None:
    """Give every IndexedDataset under `ds` a reader that maps its .bin at the first read."""
    from megatron.core.datasets.indexed_dataset import get_bin_path
    lazy = _lazy_bin_reader_class()
    for ix in indexed_datasets(ds):
        ix.bin_reader = lazy(get_bin_path(ix.path_prefix))


def build_datasets(cfg, *, seed: int, train_samples: int):
    """(train_ds, valid_ds): the blended training set and the packed validation set."""
    import logging

    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder)
    from megatron.core.datasets.gpt_dataset import GPTDataset
    if train_samples < 1:
        raise DataError(f"train_samples must be >= 1, got {train_samples}")
    p = data_paths(cfg)
    for prefix in (*p.train, p.valid):
        read_index(prefix, deep=False)  # clear error before megatron's asserts
    p.index_cache.mkdir(parents=True, exist_ok=True)
    gcfg = gpt_dataset_config(cfg, seed=seed)
    quiet = logging.getLogger("megatron.core.datasets")
    level = quiet.level
    quiet.setLevel(max(level, logging.WARNING))
    try:
        train, _, _ = BlendedMegatronDatasetBuilder(
            GPTDataset, [train_samples, None, None], lambda: True, gcfg).build()
    finally:
        quiet.setLevel(level)
    if train is None or len(train) < train_samples:
        raise DataError(f"training blend built {0 if train is None else len(train)} samples, "
                        f"{train_samples} requested")
    make_bin_reads_lazy(train)
    valid = PackedValidationDataset(str(p.valid), num_samples=cfg.derived.eval_samples,
                                    seq_length=cfg.model.seq_length)
    assert min_valid_tokens(cfg) <= valid.info.tokens
    return train, valid
