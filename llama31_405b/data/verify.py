"""Data verification in two parts (docs/data.md, "Verification").

`verify_data(cfg)` (`python -m llama31_405b data verify CONFIG`) checks the contents, reading the
.bin files; run_and_time.sh runs it once per job, before the timed runs. It accepts the
project's prepared data and MLCommons' ready-made files once recorded (`--write-manifest`
records files that have no manifest entry yet, origin "accepted"), and for every dataset it
passes it writes a verification record into the manifest (`data.manifest`, by default
DATA_DIR/manifest.json): what was checked, when, and the size and mtime of each file. It
refuses, before reading any .bin, a manifest it could not write (data on a read-only mount:
point `data.manifest` elsewhere) and warns of an index cache folder the first run could not
write. Checks, cheapest first:

- data_dir, tokenizer and every .bin/.idx exist; the tokenizer vocab fits the model's vocab;
- each .idx/.bin pair is internally consistent (header, dtype, counts, sizes, pointers);
- the validation set holds eval_samples x seq_length + 1 tokens (and, for llama31_405b,
  MLCommons' `c4-validation-91205-samples` file holds its 91,205 documents);
- each file matches its manifest record (size + sampled checksum; whole-file sha256 with
  `full=True`), and prepared data was made with this very tokenizer;
- the dtype holds the tokenizer's ids, and token ids are below the tokenizer vocab (every token
  of files up to 64 M tokens, 16 spread blocks of larger ones; all with `full=True`);
- the end-of-document convention (documents ending with the tokenizer's EOD, or not: the
  reference's data has no EOD) is the same for every dataset, and as prepared.

`require_verified(cfg)` is what `train` runs in init, before run_start. It reads the manifest,
the tokenizer, the .idx headers and file sizes and mtimes (stat), and never opens a .bin (MLPerf
training rules: nothing touches the dataset before the clock starts; document counts and sizes
may be used). It refuses data without a passing verification record, or whose files changed
since.
"""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np

from . import manifest as mf
from .errors import DataError
from .indexed import IndexInfo, last_tokens, max_token_id, read_index
from .layout import MLCOMMONS_VALID_PREFIX, VALID_DOCS, data_paths, min_valid_tokens
from .tokenizer import SentencePieceTokenizer

SCAN_TOKENS = 1 << 26
EOD_SAMPLE = 1024
_READ_ONLY_FIX = ("for data on a read-only mount, set data.manifest (and data.index_cache_dir) to "
                  "absolute paths in a writable folder, e.g. --set data.manifest=\"/scratch/"
                  "llama31_405b/manifest.json\"; with CONT, inside a mounted folder")


def _writable(path: Path) -> bool:
    """Whether `path` (a folder or a file to create) can be written: the nearest existing
    folder on its way accepts new files."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return os.access(p, os.W_OK | (os.X_OK if p.is_dir() else 0))


def _check_writable(p, say: Callable[[str], None]) -> None:
    """The manifest's folder must take the verification record; an index cache folder that
    cannot be written is fine only if it already holds this config's caches (Megatron reads
    them), so that is a warning."""
    if not _writable(p.manifest.parent):  # a lock file, a temporary file, a rename there
        raise DataError(f"{p.manifest}: not writable, and data verify records its verification "
                        f"there every job; {_READ_ONLY_FIX}")
    if not _writable(p.index_cache):
        say(f"warning: {p.index_cache} (data.index_cache_dir) is not writable: training fails "
            "unless it already holds the dataset index caches of this config; " + _READ_ONLY_FIX)


CHECKS = ["structure", "validation_size", "dtype", "ids_below_vocab", "eod_convention",
          "manifest_record", "tokenizer"]


def _fix_unverified(cfg, sets=()) -> str:
    return (f"if these are MLCommons' ready-made files (or files you trust), run "
            f"`{verify_command(cfg, sets, '--write-manifest')}` once to record "
            "them; otherwise build them with `python -m llama31_405b data prepare`")


def _stat(path: str | Path) -> dict:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def verify_command(cfg, sets=(), *flags: str) -> str:
    """The `data verify` command line for this config as the user gave it: its --set overrides
    (`sets`, as on the command line) carried over, shell-quoted."""
    import shlex
    words = ["python", "-m", "llama31_405b", "data", "verify", cfg.source or "CONFIG"]
    for item in sets or ():
        words += ["--set", item]
    return " ".join(shlex.quote(w) for w in [*words, *flags])


def _tokenizer(cfg, p) -> SentencePieceTokenizer:
    if not p.data_dir.is_dir():
        raise DataError(f"data.data_dir = {p.data_dir}: folder not found; point [data] data_dir "
                        "(or the launcher's DATADIR) at the prepared data, or for the tiny "
                        "benchmark run `python -m llama31_405b data tiny`")
    if not p.tokenizer.is_file():
        raise DataError(f"data.tokenizer = {p.tokenizer}: not found (the key is relative to "
                        "data.data_dir). Full scale: put the Mixtral 8x22B tokenizer.model there "
                        "(it ships with MLCommons' data) or point data.tokenizer at it; tiny: run "
                        "`python -m llama31_405b data tiny`")
    try:
        tok = SentencePieceTokenizer(p.tokenizer)
    except DataError as e:   # "tokenizer PATH: what" -> "data.tokenizer = PATH: what"
        what = str(e).removeprefix(f"tokenizer {p.tokenizer}: ")
        raise DataError(f"data.tokenizer = {p.tokenizer}: {what}") from None
    if tok.vocab_size > cfg.model.vocab_size:
        raise DataError(f"data.tokenizer = {p.tokenizer}: tokenizer vocab {tok.vocab_size} is "
                        f"larger than "
                        f"model.vocab_size {cfg.model.vocab_size} ({cfg.source or 'config'}); ids "
                        "past the embedding table would crash training: use the matching tokenizer "
                        "or a model with a larger vocab")
    return tok


def _check_validation(cfg, valid: IndexInfo) -> None:
    """What the benchmark fixes about the validation set (from the .idx header and sizes)."""
    name = Path(valid.prefix).name
    if (cfg.run.benchmark == "llama31_405b" and valid.documents != VALID_DOCS
            and name.replace("validationn", "validation") == MLCOMMONS_VALID_PREFIX):
        raise DataError(f"{valid.prefix}.idx: {valid.documents} documents, MLCommons' validation "
                        f"file has {VALID_DOCS}; the file is not the benchmark's validation set")
    need = min_valid_tokens(cfg)
    if valid.tokens < need:
        raise DataError(f"{valid.prefix}.bin: {valid.tokens} tokens, but "
                        f"{cfg.derived.eval_samples} validation sequences of "
                        f"{cfg.model.seq_length} need {need}; prepare more validation documents")


def _eod_convention(infos: dict, conventions: dict[Path, str], eod: int) -> str:
    found = set(conventions.values())
    if len(found) > 1:
        which = ", ".join(f"{Path(infos[k].prefix).name}: {v}" for k, v in conventions.items())
        raise DataError(f"the datasets disagree on end-of-document tokens ({which}; EOD id {eod}); "
                        "prepare them all the same way (the reference: no EOD)")
    return found.pop() if found else "none"


def check_content(info: IndexInfo, tok: SentencePieceTokenizer, *, full: bool) -> dict:
    """Content checks of one dataset (reads its .bin); returns what was found."""
    if np.iinfo(info.dtype).max < tok.vocab_size - 1:
        raise DataError(f"{info.prefix}.idx: dtype {np.dtype(info.dtype).name} cannot hold the "
                        f"{tok.vocab_size} ids of {tok.path}; the data and tokenizer do not match")
    top, how = max_token_id(info, scan_all=full, block=SCAN_TOKENS)
    if top >= tok.vocab_size:
        raise DataError(f"{info.prefix}.bin: token id {top} >= vocab size {tok.vocab_size} of "
                        f"{tok.path}; the data was made with another tokenizer")
    ends = last_tokens(info, EOD_SAMPLE)
    eod = "appended" if ends.size and np.all(ends == tok.eod) else "none"
    return {"dtype": np.dtype(info.dtype).name, "max_id": top, "ids_checked": how,
            "eod": eod, "eod_id": tok.eod, "eod_sampled_documents": int(ends.size)}


def verification_record(info: IndexInfo, tok, content: dict, *, full: bool) -> dict:
    """The manifest's record of a passing verification of one dataset."""
    return {"passed": True, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "full": full, "checks": CHECKS, **content, "tokenizer_sha256": tok.sha256,
            "documents": info.documents, "tokens": info.tokens,
            "files": {ext: _stat(f"{info.prefix}{ext}") for ext in (".bin", ".idx")}}


def _write(data_dir: Path, new_files: dict, new_sets: dict, verified: dict,
           manifest: Path | None = None) -> None:
    where = mf.manifest_path(data_dir, manifest)
    try:
        with mf.updating(data_dir, where) as m:
            m["files"].update(new_files)
            m["datasets"].update(new_sets)
            for key, rec in verified.items():
                m["datasets"][key]["verified"] = rec
    except OSError as e:
        hint = (": " + _READ_ONLY_FIX if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
                else "")
        raise DataError(f"{where}: cannot record the verification ({e}); data verify writes "
                        f"to the manifest every job{hint}") from None


def verify_data(cfg, *, full: bool = False, write_manifest: bool = False,
                log: Callable[[str], None] | None = None, sets=()) -> dict:
    """Check the data cfg names and record a passing verification per dataset in the manifest;
    raise DataError naming the file and the fix otherwise. `write_manifest`: record files that
    have no manifest entry, and re-record (origin "accepted", after the same content checks)
    files whose entry they no longer match, saying so: the fix the mismatch message suggests.
    `sets`: the user's --set overrides, carried into the commands messages suggest. Returns
    {"eod": "none"|"appended", "datasets": {manifest key: verification record}}."""
    say = log or (lambda msg: None)
    p = data_paths(cfg)
    tok = _tokenizer(cfg, p)
    _check_writable(p, say)
    infos = {}
    for prefix in p.prefixes():
        try:
            infos[prefix] = read_index(prefix)
        except DataError as e:
            raise DataError(f"{e}{_recorded_dtype(p, prefix)}") from None
    _check_validation(cfg, infos[p.valid])
    where = p.manifest
    m = mf.load_manifest(p.data_dir, where)
    new_files: dict[str, dict] = {}
    new_sets: dict[str, dict] = {}
    verified: dict[str, dict] = {}
    unverified: list[str] = []
    rerecord = verify_command(cfg, sets, *(["--full"] if full else []), "--write-manifest")

    def changed(e: DataError) -> None:
        """A recorded file no longer matches its record: an error, or with --write-manifest
        (the user says the new file is right) a warning, and the file is recorded anew."""
        if not write_manifest:
            raise e
        what = str(e).split("; the file changed since")[0].split("; if the new files are")[0]
        say(f"warning: {what}; --write-manifest: recording it as it is now (origin accepted)")

    tkey = mf.rel(p.tokenizer, p.data_dir)
    if tkey in m["files"]:
        try:
            mf.check_file(p.tokenizer, m["files"][tkey], full=full, where=where, fix=rerecord)
        except DataError as e:
            changed(e)
            new_files[tkey] = mf.file_record(p.tokenizer)
    elif write_manifest:
        new_files[tkey] = mf.file_record(p.tokenizer)
    else:
        unverified.append(str(p.tokenizer))
    recorded = {}
    for prefix, info in infos.items():
        key = mf.rel(prefix, p.data_dir)
        ds = m["datasets"].get(key)
        recs = [m["files"].get(key + ext) for ext in (".bin", ".idx")]
        if ds is None or None in recs:
            if not write_manifest:
                unverified.append(f"{prefix}.bin/.idx")
            continue
        if ds.get("tokenizer_sha256") not in (None, tok.sha256):
            raise DataError(f"{prefix}: prepared with a different tokenizer (sha256 "
                            f"{ds['tokenizer_sha256'][:12]}..., data.tokenizer = {p.tokenizer} "
                            f"is {tok.sha256[:12]}...); prepare the data again or fix "
                            "data.tokenizer")
        try:
            for ext, rec in zip((".bin", ".idx"), recs):
                mf.check_file(Path(f"{prefix}{ext}"), rec, full=full, where=where, fix=rerecord)
            if (ds.get("documents"), ds.get("tokens")) != (info.documents, info.tokens):
                raise DataError(f"{prefix}: holds {info.documents} documents / {info.tokens} "
                                f"tokens, {where} says {ds.get('documents')} / "
                                f"{ds.get('tokens')}; if the new files are right, run "
                                f"`{rerecord}`")
        except DataError as e:
            changed(e)
            continue
        recorded[prefix] = ds
    if unverified:
        msg = (f"not verified against {where}: {', '.join(unverified)}; "
               + _fix_unverified(cfg, sets))
        if cfg.data.require_verified:
            raise DataError(msg)
        say("warning: " + msg + " (data.require_verified = false: continuing)")
    content = {prefix: check_content(info, tok, full=full) for prefix, info in infos.items()}
    conv = _eod_convention(infos, {k: content[k]["eod"] for k in (*p.train, p.valid)}, tok.eod)
    for prefix, info in infos.items():
        key = mf.rel(prefix, p.data_dir)
        ds = recorded.get(prefix)
        found = content[prefix]["eod"]
        if ds is None:
            if not write_manifest:
                continue
            say(f"recording {key}.bin/.idx (sha256 of {info.bin_size / 1e9:.2f} GB)")
            for ext in (".bin", ".idx"):
                new_files[key + ext] = mf.file_record(f"{prefix}{ext}")
            ds = new_sets[key] = {
                "origin": "accepted", "documents": info.documents, "tokens": info.tokens,
                "dtype": np.dtype(info.dtype).name, "tokenizer_sha256": tok.sha256,
                "tokenizer_vocab_size": tok.vocab_size, "eod": tok.eod,
                "append_eod": found == "appended"}
        elif ds.get("append_eod") is not None and ds["append_eod"] != (found == "appended"):
            raise DataError(f"{prefix}.bin: documents {'do not ' * (found == 'none')}end "
                            f"with EOD id {tok.eod}, but {where} records append_eod = "
                            f"{ds['append_eod']}; the file changed: prepare it again")
        verified[key] = verification_record(info, tok, content[prefix], full=full)
        say(f"ok {key}: {info.documents} documents, {info.tokens} tokens, EOD {found}, ids < "
            f"{content[prefix]['max_id'] + 1} ({content[prefix]['ids_checked']}), "
            f"{ds.get('origin')}")
    _write(p.data_dir, new_files, new_sets, verified, where)
    if new_files:
        say(f"wrote {len(new_files)} file records to {where}")
    say(f"recorded a passing verification of {len(verified)} datasets in {where}")
    return {"eod": conv, "datasets": verified}


def prefix_keys(cfg, p) -> dict[Path, str]:
    """Each dataset prefix -> the config key that names it (for messages)."""
    d = cfg.data
    keys = {prefix: f"data.train_prefixes[{i}] = {name}"
            for i, (prefix, name) in enumerate(zip(p.train, d.train_prefixes))}
    keys[p.valid] = f"data.valid_prefix = {d.valid_prefix}"
    if p.pretrain:
        keys[p.pretrain] = f"data.pretrain_prefix = {d.pretrain_prefix}"
    return keys


def check_metadata(cfg):
    """The checks `train` can afford before run_start and before any expensive work: data_dir
    and the tokenizer exist, the tokenizer loads and fits the model's vocab, every .bin/.idx
    exists and agrees with its .idx header (sizes: a truncated .bin is refused here), the
    validation set is large enough. Reads the tokenizer, the .idx headers and stat, never a .bin.
    Returns (data paths, tokenizer, {prefix: IndexInfo}); DataError names the config key and the
    file."""
    p = data_paths(cfg)
    tok = _tokenizer(cfg, p)
    infos = {}
    for prefix, key in prefix_keys(cfg, p).items():
        try:
            infos[prefix] = read_index(prefix, deep=False)
        except DataError as e:
            raise DataError(f"{key}: {e}{_recorded_dtype(p, prefix)}") from None
    _check_validation(cfg, infos[p.valid])
    return p, tok, infos


def _recorded_dtype(p, prefix: Path) -> str:
    """'; the manifest M records uint16 tokens for it' (what the dataset was prepared or
    verified with), for a .idx/.bin pair that disagrees; '' when the manifest says nothing."""
    try:
        ds = mf.load_manifest(p.data_dir, p.manifest)["datasets"].get(mf.rel(prefix, p.data_dir))
    except (DataError, OSError, ValueError, KeyError, TypeError):
        return ""
    ds = ds if isinstance(ds, dict) else {}
    dtype = ds.get("dtype") or (ds.get("verified") or {}).get("dtype")
    if not dtype:
        return ""
    return (f"; the manifest {p.manifest} records {dtype} tokens for {prefix.name} (restore the "
            "files it describes, or prepare the data again)")


def require_verified(cfg, sets=()) -> dict:
    """Raise DataError unless every dataset cfg names has a passing verification record in the
    manifest and its files are unchanged since (size and mtime). Reads the manifest, the
    tokenizer, .idx headers and stat only: safe before run_start. `sets`: the user's --set
    overrides, carried into the `data verify` command it suggests. Returns
    {"eod": "none"|"appended", "datasets": {manifest key: verification record}}."""
    p, tok, infos = check_metadata(cfg)
    where = p.manifest
    m = mf.load_manifest(p.data_dir, where)
    fix = (f"run `{verify_command(cfg, sets)}` first "
           "(run_and_time.sh does, once per job before the runs)")
    trec = m["files"].get(mf.rel(p.tokenizer, p.data_dir))
    if trec and trec.get("sha256") not in (None, tok.sha256):
        raise DataError(f"data.tokenizer = {p.tokenizer}: changed since {where} was written "
                        f"(sha256 {tok.sha256[:12]}..., recorded {trec['sha256'][:12]}...); "
                        "restore it or prepare the data again")
    records: dict[str, dict] = {}
    problems: list[str] = []
    for prefix, info in infos.items():
        key = mf.rel(prefix, p.data_dir)
        v = (m["datasets"].get(key) or {}).get("verified") or {}
        if not v.get("passed"):
            problems.append(f"{key}: no passing verification recorded")
            continue
        changed = [ext for ext in (".bin", ".idx")
                   if v.get("files", {}).get(ext) != _stat(f"{prefix}{ext}")]
        if changed:
            problems.append(f"{key}{'/'.join(changed)}: size or mtime changed since the "
                            f"verification of {v.get('time')}")
        elif v.get("tokenizer_sha256") != tok.sha256:
            problems.append(f"{key}: verified with another tokenizer than {p.tokenizer}")
        elif (v.get("documents"), v.get("tokens")) != (info.documents, info.tokens):
            problems.append(f"{key}: {info.documents} documents / {info.tokens} tokens, verified "
                            f"{v.get('documents')} / {v.get('tokens')}")
        records[key] = v
    if problems:
        raise DataError(f"data not verified ({where}): {'; '.join(problems)}; {fix}")
    keys = {prefix: mf.rel(prefix, p.data_dir) for prefix in (*p.train, p.valid)}
    conv = _eod_convention(infos, {k: records[key]["eod"] for k, key in keys.items()}, tok.eod)
    return {"eod": conv, "datasets": records}


def verify_prepared(data_dir: str | Path, tokenizer: str | Path, prefixes: list[Path],
                    manifest: Path | None = None) -> None:
    """Content checks of datasets `prepare` has just written and recorded, and their passing
    verification records (ensure_tiny_data: the tiny data is ready to train on at once). The
    config-level checks (validation size, vocab fit) are require_verified's, from the .idx."""
    data_dir = Path(data_dir)
    tok = SentencePieceTokenizer(tokenizer)
    m = mf.load_manifest(data_dir, manifest)
    verified = {}
    for prefix in prefixes:
        key = mf.rel(prefix, data_dir)
        ds = m["datasets"].get(key)
        if ds is None or ds.get("tokenizer_sha256") != tok.sha256:
            raise DataError(f"{prefix}: not prepared with {tokenizer} (no matching record in "
                            f"{mf.manifest_path(data_dir, manifest)}); prepare it again")
        info = read_index(prefix)
        verified[key] = verification_record(info, tok, check_content(info, tok, full=True),
                                            full=True)
    _write(data_dir, {}, {}, verified, manifest)
