"""`verify_data(cfg)`: the data check training runs before run_start.

It accepts the project's own prepared data (recorded in DATA_DIR/manifest.json by `data
prepare`) and MLCommons' ready-made files once they are recorded: `data verify CONFIG
--write-manifest` checks their structure and records their sizes and checksums (origin
"accepted"). Every later verify compares against that record. Checks, cheapest first:

- data_dir, tokenizer and every .bin/.idx exist; the tokenizer vocab fits the model's vocab;
- each .idx/.bin pair is internally consistent (header, dtype, counts, sizes, pointers), its
  dtype can hold the tokenizer's ids, its documents end with the tokenizer's EOD;
- each file matches its manifest record (size + sampled checksum; whole-file sha256 with
  `full=True`), and prepared data was made with this very tokenizer;
- the validation set holds eval_samples x seq_length + 1 tokens (and 91,205 documents when it is
  MLCommons' `c4-validation-91205-samples` file); token ids are below the tokenizer vocab
  (scanned for datasets up to 64 M tokens, or all with `full=True`).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import numpy as np

from . import manifest as mf
from .errors import DataError
from .indexed import IndexInfo, last_tokens, read_index, token_stream
from .layout import MLCOMMONS_VALID_PREFIX, VALID_DOCS, data_paths, min_valid_tokens
from .tokenizer import SentencePieceTokenizer

SCAN_TOKENS = 1 << 26


def _say(msg: str) -> None:
    print(msg, file=sys.stderr)


def _fix_unverified(cfg_src: str) -> str:
    return (f"if these are MLCommons' ready-made files (or files you trust), run `python -m "
            f"llama31_405b data verify {cfg_src or 'CONFIG'} --write-manifest` once to record "
            "them; otherwise build them with `python -m llama31_405b data prepare`")


def _check_tokens(info: IndexInfo, tok: SentencePieceTokenizer, full: bool) -> None:
    if np.iinfo(info.dtype).max < tok.vocab_size - 1:
        raise DataError(f"{info.prefix}.idx: dtype {np.dtype(info.dtype).name} cannot hold the "
                        f"{tok.vocab_size} ids of {tok.path}; the data and tokenizer do not match")
    ends = last_tokens(info, 64)
    if ends.size and not np.all(ends == tok.eod):
        raise DataError(f"{info.prefix}.bin: documents do not end with EOD id {tok.eod} of "
                        f"{tok.path} (found {sorted(set(ends.tolist()))[:5]}); the data was "
                        "prepared without EOD or with another tokenizer: prepare it again")
    if full or info.tokens <= SCAN_TOKENS:
        stream = token_stream(info)
        top = 0
        for start in range(0, info.tokens, SCAN_TOKENS):
            top = max(top, int(stream[start:start + SCAN_TOKENS].max()))
        if top >= tok.vocab_size:
            raise DataError(f"{info.prefix}.bin: token id {top} >= vocab size {tok.vocab_size} of "
                            f"{tok.path}; the data was made with another tokenizer")


def verify_data(cfg, *, full: bool = False, write_manifest: bool = False,
                log: Callable[[str], None] | None = None) -> None:
    """Raise DataError unless the data cfg names is present, consistent and verified."""
    say = log or (lambda msg: None)
    p = data_paths(cfg)
    if not p.data_dir.is_dir():
        raise DataError(f"data.data_dir {p.data_dir}: folder not found; point [data] data_dir (or "
                        "the launcher's DATADIR) at the prepared data, or for the tiny benchmark "
                        "run `python -m llama31_405b data tiny`")
    tok = SentencePieceTokenizer(p.tokenizer)
    if tok.vocab_size > cfg.model.vocab_size:
        raise DataError(f"{p.tokenizer}: tokenizer vocab {tok.vocab_size} is larger than "
                        f"model.vocab_size {cfg.model.vocab_size} ({cfg.source or 'config'}); ids "
                        "past the embedding table would crash training: use the matching tokenizer "
                        "or a model with a larger vocab")
    infos = {}
    for prefix in p.prefixes():
        infos[prefix] = info = read_index(prefix)
        _check_tokens(info, tok, full)
    where = mf.manifest_path(p.data_dir)
    m = mf.load_manifest(p.data_dir)
    new_files: dict[str, dict] = {}
    new_sets: dict[str, dict] = {}
    unverified: list[str] = []
    tkey = mf.rel(p.tokenizer, p.data_dir)
    if tkey in m["files"]:
        mf.check_file(p.tokenizer, m["files"][tkey], full=full, where=where)
    elif write_manifest:
        new_files[tkey] = mf.file_record(p.tokenizer)
    else:
        unverified.append(str(p.tokenizer))
    for prefix, info in infos.items():
        key = mf.rel(prefix, p.data_dir)
        ds = m["datasets"].get(key)
        recs = [m["files"].get(key + ext) for ext in (".bin", ".idx")]
        if ds is None or None in recs:
            if not write_manifest:
                unverified.append(f"{prefix}.bin/.idx")
                continue
            say(f"recording {key}.bin/.idx (sha256 of {info.bin_size / 1e9:.2f} GB)")
            for ext in (".bin", ".idx"):
                new_files[key + ext] = mf.file_record(f"{prefix}{ext}")
            new_sets[key] = {"origin": "accepted", "documents": info.documents,
                             "tokens": info.tokens, "dtype": np.dtype(info.dtype).name,
                             "tokenizer_sha256": tok.sha256, "tokenizer_vocab_size": tok.vocab_size,
                             "eod": tok.eod}
            continue
        for ext, rec in zip((".bin", ".idx"), recs):
            mf.check_file(Path(f"{prefix}{ext}"), rec, full=full, where=where)
        if ds.get("tokenizer_sha256") not in (None, tok.sha256):
            raise DataError(f"{prefix}: prepared with a different tokenizer (sha256 "
                            f"{ds['tokenizer_sha256'][:12]}..., configured {p.tokenizer} is "
                            f"{tok.sha256[:12]}...); prepare the data again or fix data.tokenizer")
        if (ds.get("documents"), ds.get("tokens")) != (info.documents, info.tokens):
            raise DataError(f"{prefix}: holds {info.documents} documents / {info.tokens} tokens, "
                            f"{where} says {ds.get('documents')} / {ds.get('tokens')}")
        say(f"ok {key}: {info.documents} documents, {info.tokens} tokens ({ds.get('origin')})")
    valid = infos[p.valid]
    need = min_valid_tokens(cfg)
    if valid.tokens < need:
        raise DataError(f"{p.valid}.bin: {valid.tokens} tokens, but {cfg.derived.eval_samples} "
                        f"validation sequences of {cfg.model.seq_length} need {need}; prepare more "
                        "validation documents")
    if p.valid.name == MLCOMMONS_VALID_PREFIX and valid.documents != VALID_DOCS:
        raise DataError(f"{p.valid}.idx: {valid.documents} documents, MLCommons' validation file "
                        f"has {VALID_DOCS}; the file is not the benchmark's validation set")
    if unverified:
        msg = (f"not verified against {where}: {', '.join(unverified)}; "
               + _fix_unverified(cfg.source))
        if cfg.data.require_verified:
            raise DataError(msg)
        say("warning: " + msg + " (data.require_verified = false: continuing)")
    if new_files or new_sets:
        with mf.updating(p.data_dir) as m2:
            m2["files"].update(new_files)
            m2["datasets"].update(new_sets)
        say(f"wrote {len(new_files)} file records to {where}")
