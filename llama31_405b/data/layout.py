"""Where the data lives: paths from a config, and the benchmark's C4 layout.

MLPerf's llama31_405b data (C4 `en` 3.0.1): the 1024 raw training shards
`c4-train.NNNNN-of-01024.json.gz` are consolidated into 8 files of 128 shards; the benchmark trains
on the last two, `c4-train.en_6` (raw shards 768-895) and `c4-train.en_7` (896-1023), blended
50/50. Validation is the first 91,205 documents of `c4-validation.NNNNN-of-00008.json.gz`, read in
shard order: just over 5,760 x 8,192 tokens, packed into exactly 5,760 sequences.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import DataError
from .prepare import Output

TRAIN_SHARD = "c4-train.{:05d}-of-01024.json.gz"
VALID_SHARD = "c4-validation.{:05d}-of-00008.json.gz"
TRAIN_RANGES = {"en_6": range(768, 896), "en_7": range(896, 1024)}
VALID_DOCS = 91205
MLCOMMONS_VALID_PREFIX = "c4-validation-91205-samples.en_text_document"


@dataclass(frozen=True)
class DataPaths:
    data_dir: Path
    tokenizer: Path
    train: tuple[Path, ...]
    weights: tuple[float, ...]
    valid: Path
    pretrain: Path | None
    index_cache: Path

    def prefixes(self) -> list[Path]:
        return [*self.train, self.valid] + ([self.pretrain] if self.pretrain else [])


def data_paths(cfg) -> DataPaths:
    """Absolute paths of everything `cfg.data` names (a relative data_dir is relative to CWD)."""
    d = cfg.data
    root = Path(d.data_dir).absolute()
    cache = Path(d.index_cache_dir)
    return DataPaths(
        data_dir=root, tokenizer=root / d.tokenizer,
        train=tuple(root / p for p in d.train_prefixes), weights=tuple(d.train_weights),
        valid=root / d.valid_prefix,
        pretrain=root / d.pretrain_prefix if d.pretrain_prefix else None,
        index_cache=cache if cache.is_absolute() else root / cache)


def min_valid_tokens(cfg) -> int:
    """Tokens the validation set must hold: eval_samples sequences of seq_length, + 1 label."""
    return cfg.derived.eval_samples * cfg.model.seq_length + 1


def _missing(paths: list[Path]) -> None:
    gone = [p for p in paths if not p.is_file()]
    if gone:
        raise DataError(f"{len(gone)} raw C4 shards missing, e.g. {gone[0]}"
                        + (f" ... {gone[-1]}" if len(gone) > 1 else "")
                        + "; download C4 en 3.0.1 (the `en` json.gz files) into that folder")


def benchmark_outputs(cfg, raw_dir: str | Path) -> list[Output]:
    """The benchmark's outputs from raw C4 shards in `raw_dir`: en_6, en_7 and validation."""
    raw = Path(raw_dir)
    paths = data_paths(cfg)
    outs = []
    for prefix in paths.train:
        which = [k for k in TRAIN_RANGES if k in prefix.name]
        if len(which) != 1:
            raise DataError(f"data.train_prefixes: {prefix.name!r} names neither en_6 nor en_7; the "
                            "benchmark layout builds c4-train.en_6/en_7 (raw shards 768-1023)")
        inputs = [raw / TRAIN_SHARD.format(i) for i in TRAIN_RANGES[which[0]]]
        _missing(inputs)
        outs.append(Output(prefix=prefix, inputs=tuple(inputs)))
    valid = [raw / VALID_SHARD.format(i) for i in range(8)]
    _missing(valid[:1])
    valid = [p for p in valid if p.is_file()]
    outs.append(Output(prefix=paths.valid, inputs=tuple(valid), max_docs=VALID_DOCS,
                       min_tokens=min_valid_tokens(cfg)))
    return outs
