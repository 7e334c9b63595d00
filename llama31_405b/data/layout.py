"""Where the data lives: paths from a config, and the benchmark's C4 layout.

MLPerf's llama31_405b data (C4 `en` 3.0.1): the 1024 raw training shards
`c4-train.NNNNN-of-01024.json.gz` are consolidated into 8 files of 128 shards; the benchmark trains
on the last two, `c4-train.en_6` (raw shards 768-895) and `c4-train.en_7` (896-1023), blended
50/50. Validation is the first 91,205 documents of `c4-validation.NNNNN-of-00008.json.gz`, read in
shard order: just over 5,760 x 8,192 tokens, packed into exactly 5,760 sequences.

MLCommons' download of the prepared files has a quirk `resolve_prefix` accepts as it is: the
validation pair sits in a folder named like the prefix, its files misspelt
`c4-validationn-91205-samples.en_text_document.{bin,idx}`. The `c4-validation-small` and
`c4-validation` files of that download are not used and are left alone.
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
    manifest: Path

    def prefixes(self) -> list[Path]:
        return [*self.train, self.valid] + ([self.pretrain] if self.pretrain else [])


def _has_pair(prefix: Path) -> bool:
    return Path(f"{prefix}.bin").is_file() and Path(f"{prefix}.idx").is_file()


def resolve_prefix(prefix: Path) -> Path:
    """Where the pair `prefix`.bin/.idx really is (stat only, no file is opened).

    `prefix` itself when its files exist; otherwise, when `prefix` is a folder (MLCommons'
    download puts the validation pair in a folder of the same name), the pair inside it named
    like the folder, or misspelt like MLCommons' validation files, or the folder's only pair.
    Anything else comes back unchanged, so that read_index names the missing file."""
    if _has_pair(prefix):
        return prefix
    folders = [f for f in (Path(f"{prefix}.bin"), Path(f"{prefix}.idx")) if f.is_dir()]
    if folders:
        inside = [str(f) for d in folders for f in sorted(d.iterdir())][:4]
        raise DataError(f"{folders[0]}: a folder, where a file was expected (it holds "
                        f"{', '.join(inside) or 'nothing'}); move the files out so that "
                        f"{prefix.name}.bin and {prefix.name}.idx sit side by side in "
                        f"{prefix.parent}")
    if not prefix.is_dir():
        return prefix
    for name in (prefix.name, prefix.name.replace("c4-validation-", "c4-validationn-", 1)):
        if _has_pair(prefix / name):
            return prefix / name
    pairs = sorted(p.with_suffix("") for p in prefix.glob("*.idx") if _has_pair(p.with_suffix("")))
    if len(pairs) == 1:
        return pairs[0]
    found = ", ".join(p.name for p in pairs) or "no .bin/.idx pair"
    raise DataError(f"{prefix}: a folder, where the indexed dataset {prefix.name}.bin/.idx was "
                    f"expected; it holds {found}. Move the right pair there as "
                    f"{prefix.name}.bin/.idx, or point the config's prefix at it")


def data_paths(cfg, *, resolve: bool = True) -> DataPaths:
    """Absolute paths of everything `cfg.data` names (a relative data_dir is relative to CWD);
    dataset prefixes go through resolve_prefix unless `resolve=False` (outputs to write)."""
    d = cfg.data
    root = Path(d.data_dir).absolute()
    cache, manifest = Path(d.index_cache_dir), Path(d.manifest)
    res = resolve_prefix if resolve else (lambda p: p)
    return DataPaths(
        data_dir=root, tokenizer=root / d.tokenizer,
        train=tuple(res(root / p) for p in d.train_prefixes), weights=tuple(d.train_weights),
        valid=res(root / d.valid_prefix),
        pretrain=res(root / d.pretrain_prefix) if d.pretrain_prefix else None,
        index_cache=cache if cache.is_absolute() else root / cache,
        manifest=manifest if manifest.is_absolute() else root / manifest)


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
    paths = data_paths(cfg, resolve=False)
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
