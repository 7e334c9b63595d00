"""The training data a run asks for, and the index megatron-core builds for it at init:

    python -m llama31_405b.rehearse.dataset CONFIG --out FILE [--max-index-gb X] [--set K=V]

The run requests max_steps x GBS samples from the blend (train/loop.py). megatron-core 0.19.2's
BlendedMegatronDatasetBuilder asks each dataset of the blend for
`_get_size_per_split_per_dataset(weights, [samples], surplus=mid_level_dataset_surplus)` samples;
each GPTDataset then builds, on rank 0 before init_stop (`_build_document_sample_shuffle_indices`):
- a document index: every document id once per epoch, int32, epochs = the fewest whose tokens
  cover the samples (`_get_num_epochs`);
- a sample index: (samples in those epochs + 1) x 2, int32, or int64 when the document index
  or a document is longer than 2^31 - 1 (`helpers.build_sample_idx`);
- a shuffle index: one entry per sample, uint32, or int64 from 2^32 - 2 (`_build_shuffle_index`);
and the BlendedDataset an int16 dataset index and an int64 sample index per requested sample.
Beside it, what the training .idx files cost at init per node (`idx_footprint`: bytes read from
the data file system and host memory, data/index_share.py).

Document and token counts come from the prepared data's .idx files when they are there (only the
.idx: the .bin is never opened), otherwise from the size of C4 en_6/en_7 below. The build time is
measured by running megatron-core's own index functions over document lengths of those counts
(the real lengths from the .idx when present), in full when the index is small, otherwise at a
fraction of the size and scaled up (labelled "extrapolated"). Nothing is written to disk.
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

C4_EN_TRAIN_DOCUMENTS = 364_868_892
"""Documents of C4 `en` 3.0.1's train split: TensorFlow Datasets catalog, c4/en 3.0.1, split
'train' (https://www.tensorflow.org/datasets/catalog/c4); the same count is on the Hugging Face
dataset card of allenai/c4 (en, train)."""
C4_EN_TRAIN_SHARDS = 1024
C4_SHARDS_PER_FILE = 128
"""en_6 = raw shards 768-895, en_7 = 896-1023 (data/layout.py)."""
TOKENS_PER_DOCUMENT = 47_185_920 / 91_205
"""ESTIMATE of the mean document length under the Mixtral 8x22B tokenizer (no public count of C4
en in that tokenizer is known to us): the MLPerf reference's validation set is the first 91,205
validation documents because they hold just over 5,760 x 8,192 = 47,185,920 tokens (data/layout.py;
mlcommons/training large_language_model_pretraining/nemo). Training documents are assumed as
long on average: ~517 tokens per document."""
FULL_BUILD_MAX_BYTES = 64 << 20
"""The index is timed at 1/scale of its size, scale = ceil(size / this) (the shipped configs:
about 1/7, a few seconds and well under 1 GB here)."""
INT32_MAX = np.iinfo(np.int32).max


@dataclass
class DatasetIndex:
    prefix: str
    source: str
    """"idx" (the prepared file's metadata) or "C4 estimate"."""
    documents: int
    tokens: int
    max_document: int
    """Longest document in tokens (0: unknown; only decides int32/int64 of the sample index)."""
    samples: int
    """Samples the blend asks this dataset for (surplus included)."""
    document_entries: int = 0
    """Entries of the .idx's document index (documents + 1; the C4 estimate: one sequence per
    document, as prepared)."""
    epochs: int = 0
    document_index_bytes: int = 0
    sample_index_bytes: int = 0
    shuffle_index_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.document_index_bytes + self.sample_index_bytes + self.shuffle_index_bytes


@dataclass
class IndexPlan:
    samples: int
    """max_steps x GBS: the samples the run requests."""
    datasets: list[DatasetIndex] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    """Normalised blend weights (empty: one dataset, no blend)."""
    blend_bytes: int = 0
    build_s: float | None = None
    build_how: str = ""
    peak_build_bytes: int = 0
    """Host memory of rank 0 while building (estimate: results + the largest transient)."""
    idx_share: dict = field(default_factory=dict)
    """The training .idx files at init, per node and for the whole job (`idx_footprint`)."""
    problems: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return self.blend_bytes + sum(d.total_bytes for d in self.datasets)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["total_bytes"] = self.total_bytes
        for d, src in zip(out["datasets"], self.datasets):
            d["total_bytes"] = src.total_bytes
        return out


def _idx_lengths(prefix: str) -> tuple[np.ndarray, int] | None:
    """Sequence lengths and document-index entries from PREFIX.idx (megatron-core's header:
    magic, version, dtype code, sequence count, document count; then the int32 lengths); None
    when the file is absent."""
    path = Path(prefix + ".idx")
    if not path.is_file():
        return None
    from ..data.indexed import MAGIC
    with open(path, "rb") as f:
        head = f.read(34)
    if len(head) < 34 or head[:9] != MAGIC:
        raise ValueError(f"{path}: not a Megatron index file")
    seqs = int.from_bytes(head[18:26], "little")
    return (np.fromfile(path, dtype=np.int32, count=seqs, offset=34),
            int.from_bytes(head[26:34], "little"))


def idx_footprint(cfg, datasets: list[DatasetIndex]) -> dict:
    """The training .idx files at init (data/index_share.py): per node, the bytes read from the
    data file system and the host memory they take, with one read-only copy per node of what a
    read needs, and before it (every rank a private copy of whole files); the job's read totals."""
    from ..data.index_share import node_footprint
    d = cfg.derived
    per_node = d.system.gpus_per_node
    out = node_footprint([(x.documents, x.document_entries) for x in datasets],
                         min(per_node, d.world_size)).as_dict()
    out.update(nodes=d.nodes, job_read_bytes=out["read_bytes"] * d.nodes,
               job_read_before_bytes=out["read_before_bytes"] * d.nodes)
    return out


def _sizes(datasets: list[DatasetIndex], seq: int) -> None:
    """Fill epochs and index bytes as megatron-core's GPTDataset computes them."""
    for d in datasets:
        if d.tokens < 1:
            raise ValueError(f"{d.prefix}: no tokens ({d.source})")
        need = d.samples * seq + 1                  # add_extra_token_to_sequence
        d.epochs = max(1, math.ceil(need / d.tokens))
        doc_entries = d.epochs * d.documents
        in_index = (d.epochs * d.tokens - 1) // seq
        d.document_index_bytes = 4 * doc_entries
        wide = max(doc_entries, d.max_document) > INT32_MAX
        d.sample_index_bytes = (in_index + 1) * 2 * (8 if wide else 4)
        d.shuffle_index_bytes = in_index * (8 if in_index >= np.iinfo(np.uint32).max - 1 else 4)


def plan(cfg) -> tuple[IndexPlan, list[np.ndarray | None]]:
    """Sizes of the run's index, and each dataset's real lengths when its .idx is there."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        _get_size_per_split_per_dataset)
    from megatron.core.datasets.blended_megatron_dataset_config import (
        BlendedMegatronDatasetConfig)
    from megatron.core.datasets.utils import normalize

    from ..data.layout import data_paths
    d = cfg.derived
    paths = data_paths(cfg)
    out = IndexPlan(samples=d.max_steps * d.gbs)
    prefixes = [str(p) for p in paths.train]
    if len(prefixes) == 1:
        per = [out.samples]
    else:
        surplus = BlendedMegatronDatasetConfig.mid_level_dataset_surplus   # the field's default
        weights = normalize(list(paths.weights))
        out.weights = list(weights)
        per = [s[0] for s in _get_size_per_split_per_dataset(weights, [out.samples], surplus)]
        out.blend_bytes = sum(s[0] for s in _get_size_per_split_per_dataset(
            weights, [out.samples])) * (2 + 8)
    lengths = []
    est_docs = C4_EN_TRAIN_DOCUMENTS * C4_SHARDS_PER_FILE // C4_EN_TRAIN_SHARDS
    for prefix, samples in zip(prefixes, per):
        found = _idx_lengths(prefix)
        lengths.append(None if found is None else found[0])
        if found is not None:
            lens, entries = found
            out.datasets.append(DatasetIndex(prefix, "idx", len(lens),
                                             int(lens.sum(dtype=np.int64)),
                                             int(lens.max(initial=0)), samples, entries))
        elif d.rules.name != "llama31_405b":
            raise ValueError(f"{prefix}.idx: missing, and the size of {d.rules.name}'s data is "
                             "not known without it: prepare the data (python -m llama31_405b "
                             "data prepare) or point data.data_dir at it")
        else:
            out.datasets.append(DatasetIndex(prefix, "C4 estimate", est_docs,
                                             round(est_docs * TOKENS_PER_DOCUMENT), 0, samples,
                                             est_docs + 1))
    _sizes(out.datasets, cfg.model.seq_length)
    out.idx_share = idx_footprint(cfg, out.datasets)
    # transient of the largest document index: numpy.mgrid's int64 pair and the int32 copy, and
    # the document id and length arrays (4 B each per document)
    largest = max((x.epochs * x.documents * 20 + x.documents * 8 for x in out.datasets), default=0)
    out.peak_build_bytes = out.total_bytes + largest
    return out, lengths


def _synthetic_lengths(docs: int, tokens: int) -> np.ndarray:
    lens = np.full(docs, tokens // docs, dtype=np.int32)
    lens[: tokens % docs] += 1
    return lens


def time_build(p: IndexPlan, lengths: list, cfg, *, seed: int = 1234) -> None:
    """Run megatron-core's index functions for each dataset (and the blend) at 1/scale of the
    documents and samples, time them, and check the arrays' sizes against `_sizes` at that
    scale. The functions are linear in the documents and samples (numpy's shuffle of the
    document index dominates), so the time is scaled back up."""
    from megatron.core.datasets import helpers
    from megatron.core.datasets.gpt_dataset import _build_document_index, _build_shuffle_index
    scale = max(1, math.ceil(p.total_bytes / FULL_BUILD_MAX_BYTES))
    seq = cfg.model.seq_length
    start = time.perf_counter()
    for d, lens in zip(p.datasets, lengths):
        docs = max(1, d.documents // scale)
        if lens is None or scale > 1:
            lens = _synthetic_lengths(docs, max(d.tokens * docs // d.documents, docs))
        small = DatasetIndex(d.prefix, d.source, docs, int(lens.sum(dtype=np.int64)),
                             int(lens.max()), max(1, d.samples // scale))
        _sizes([small], seq)
        rng = np.random.RandomState(seed)
        doc_index = _build_document_index(np.arange(docs, dtype=np.int32), small.epochs, rng,
                                          False)
        sample_index = helpers.build_sample_idx(lens, doc_index, seq, small.epochs, small.tokens,
                                                True, True)
        n = sample_index.shape[0] - 1
        shuffle = _build_shuffle_index(n, n, rng)
        got = (doc_index.nbytes, sample_index.nbytes, shuffle.nbytes)
        want = (small.document_index_bytes, small.sample_index_bytes, small.shuffle_index_bytes)
        if got != want:
            p.problems.append(f"{d.prefix}: megatron-core built index arrays of {got} bytes at "
                              f"1/{scale} scale, the rehearsal's sizes say {want} (fix "
                              "rehearse/dataset.py)")
        del doc_index, sample_index, shuffle
    if p.blend_bytes:
        size = max(1, p.blend_bytes // 10 // scale)
        # megatron-core's helpers takes it from its C extension (helpers_cpp) by a star import,
        # which the type checker cannot read
        helpers.build_blending_indices(  # type: ignore[attr-defined]
            np.zeros(size, np.int16), np.zeros(size, np.int64),
            np.array(p.weights, dtype=np.float64), len(p.datasets), size, False)
    p.build_s = round((time.perf_counter() - start) * scale, 2)
    p.build_how = ("measured at full size" if scale == 1 else
                   f"extrapolated from a 1/{scale} build")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llama31_405b.rehearse.dataset")
    ap.add_argument("config")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-index-gb", type=float, default=None)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args(argv)
    start = time.perf_counter()
    result: dict = {"ok": False}
    try:
        from ..config.overrides import load_with_sets
        cfg = load_with_sets(args.config, args.set)
        p, lengths = plan(cfg)
        bound = None if args.max_index_gb is None else args.max_index_gb * 1e9
        if bound is None or p.total_bytes <= bound:
            time_build(p, lengths, cfg)
        else:
            p.build_how = "not built: larger than --max-index-gb"
        result.update(p.as_dict(), ok=not p.problems)
    except Exception as e:   # reported by the parent
        result["error"] = f"{type(e).__name__}: {e}"
    from .rank import write_result
    return write_result(args.out, result, start)


if __name__ == "__main__":
    raise SystemExit(main())
