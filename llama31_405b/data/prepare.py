"""Tokenize C4-format shards into Megatron indexed datasets (.bin/.idx), in parallel, resumably.

Each output dataset is built from its input shards in the order given; documents keep their
order in the shard and hold the ids of the reference's tokenizer path (tokenizer.py), with no BOS
and no EOD, as the MLPerf reference prepares its data (mlcommons/training,
`large_language_model_pretraining/nemo/utils/preprocess.sh` runs NeMo's
`preprocess_data_for_megatron.py` without `--append-eod`). `append_eod=True` (`data prepare
--append-eod`) appends the tokenizer's eos id after every document instead; the manifest records
which. Work units are one input shard each (an output with `max_docs`,
the validation set, is one unit that reads its shards in order until it has that many documents).
Units run in worker processes, largest first; each writes `PREFIX.parts/part-NNNNN.{bin,idx}`
under temporary names and then a `part-NNNNN.json` marker, so an interrupted run resumes at the
first unfinished shard. When every part of an output is done they are concatenated in order
(megatron-core's `IndexedDatasetBuilder.add_index`) into `PREFIX.bin.tmp`/`PREFIX.idx.tmp`,
checked, renamed to `PREFIX.bin`/`PREFIX.idx`, and recorded in the manifest with checksums. A
dataset without its manifest entry is not trusted by `data verify`, so a crash between the
renames and the manifest write never yields data that passes as complete.
"""
from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import manifest as mf
from .errors import DataError
from .indexed import read_index, token_dtype
from .parity import check_tokenizer_json, sample_texts
from .progress import Progress
from .reader import SkipCounts
from .tokenizer import TOKENIZATION, SentencePieceTokenizer
from .unit import Unit, init_worker, inherit_tokenizer, run_unit

@dataclass(frozen=True)
class Output:
    prefix: Path
    """Output path prefix (PREFIX.bin / PREFIX.idx)."""
    inputs: tuple[Path, ...]
    """Input shards, concatenated in this order."""
    max_docs: int | None = None
    """Keep only the first max_docs documents (validation: 91,205)."""
    min_tokens: int | None = None
    """Fail unless the result holds at least this many tokens (validation packing)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", Path(self.prefix))
        object.__setattr__(self, "inputs", tuple(Path(p) for p in self.inputs))


@dataclass
class Result:
    prefix: Path
    documents: int = 0
    tokens: int = 0
    skipped: SkipCounts = field(default_factory=SkipCounts)
    status: str = "prepared"
    """prepared, resumed (some parts reused) or up-to-date."""


# ---------------------------------------------------------------- main side
def _parts_dir(prefix: Path) -> Path:
    return Path(f"{prefix}.parts")


def _units(i: int, out: Output, tok: SentencePieceTokenizer, skip_bad: bool,
           append_eod: bool) -> list[Unit]:
    parts = _parts_dir(out.prefix)
    groups = [out.inputs] if out.max_docs is not None else [(p,) for p in out.inputs]
    return [Unit(out=i, part=j, inputs=tuple(g), max_docs=out.max_docs, skip_bad=skip_bad,
                  tokenizer=str(tok.path), tokenizer_sha256=tok.sha256,
                  part_prefix=parts / f"part-{j:05d}", append_eod=append_eod)
            for j, g in enumerate(groups)]


def _part_done(u: Unit) -> dict | None:
    marker = Path(f"{u.part_prefix}.json")
    if not (marker.is_file() and Path(f"{u.part_prefix}.bin").is_file()
            and Path(f"{u.part_prefix}.idx").is_file()):
        return None
    try:
        rec = json.loads(marker.read_text())
    except ValueError:
        return None
    return rec if all(rec.get(k) == v for k, v in u.key().items()) else None


def _sources(out: Output) -> list[list]:
    return [[p.name, p.stat().st_size] for p in out.inputs]


def _up_to_date(out: Output, tok: SentencePieceTokenizer, data_dir: Path, m: dict,
                skip_bad: bool, append_eod: bool, where: Path) -> dict | None:
    key = mf.rel(out.prefix, data_dir)
    ds = m["datasets"].get(key)
    if not ds or ds.get("tokenizer_sha256") != tok.sha256 or ds.get("sources") != _sources(out) \
            or ds.get("max_docs") != out.max_docs or ds.get("skip_bad") != skip_bad \
            or ds.get("append_eod") != append_eod or ds.get("tokenization") != TOKENIZATION:
        return None
    try:
        for ext in (".bin", ".idx"):
            p = Path(f"{out.prefix}{ext}")
            rec = m["files"].get(key + ext)
            if rec is None or not p.is_file():
                return None
            mf.check_file(p, rec, full=False, where=where)
    except DataError:
        return None
    return ds


def _merge(out: Output, units: list[Unit], recs: list[dict], tok, data_dir: Path,
           skip_bad: bool, append_eod: bool, where: Path) -> Result:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    prefix = out.prefix
    tmp_bin, tmp_idx = Path(f"{prefix}.bin.tmp"), Path(f"{prefix}.idx.tmp")
    if len(units) == 1:
        shutil.copyfile(f"{units[0].part_prefix}.idx", tmp_idx)
        os.replace(f"{units[0].part_prefix}.bin", tmp_bin)
    else:
        builder = IndexedDatasetBuilder(str(tmp_bin), dtype=token_dtype(tok.vocab_size))
        # megatron-core 0.19.2 `IndexedDatasetBuilder.add_index` runs a full `gc.collect()` per
        # part: ~0.25 s each over this process's heap (torch is imported), about a minute over
        # the benchmark's 2 x 128 training shards. Freezing moves what exists now out of the
        # collector's sight; the indexes the builder frees are still collected. (unfreeze also
        # thaws what was frozen before, e.g. CPython's own startup objects: harmless.)
        gc.freeze()
        try:
            for u in units:
                builder.add_index(str(u.part_prefix))
        finally:
            gc.unfreeze()
        builder.finalize(str(tmp_idx))
    # check the merged pair under a prefix-like name before it takes the final names
    check = Path(f"{prefix}.check")
    os.replace(tmp_bin, f"{check}.bin")
    os.replace(tmp_idx, f"{check}.idx")
    info = read_index(check)
    res = Result(prefix=prefix, documents=info.documents, tokens=info.tokens)
    for r in recs:
        res.skipped.add(SkipCounts(**r["skipped"]))
    if info.documents != sum(r["documents"] for r in recs):
        raise DataError(f"{prefix}: merged {info.documents} documents, parts hold "
                        f"{sum(r['documents'] for r in recs)}; delete {_parts_dir(prefix)} and rerun")
    if out.min_tokens is not None and info.tokens < out.min_tokens:
        for ext in (".bin", ".idx"):
            Path(f"{check}{ext}").unlink()
        raise DataError(f"{prefix}: {info.documents} documents hold {info.tokens} tokens, fewer "
                        f"than the {out.min_tokens} needed (eval_samples x seq_length + 1); use "
                        "more validation documents")
    key = mf.rel(prefix, data_dir)
    # drop the old record first: replaced files are untrusted
    with mf.updating(data_dir, where) as m:
        m["datasets"].pop(key, None)
        m["files"].pop(key + ".bin", None)
        m["files"].pop(key + ".idx", None)
    for ext in (".bin", ".idx"):
        os.replace(f"{check}{ext}", f"{prefix}{ext}")
    files = {key + ext: mf.file_record(f"{prefix}{ext}") for ext in (".bin", ".idx")}
    files[mf.rel(tok.path, data_dir)] = {"size": tok.path.stat().st_size,
                                         "sample_sha256": mf.sample_sha256(tok.path),
                                         "sha256": tok.sha256}
    with mf.updating(data_dir, where) as m:
        m["files"].update(files)
        m["datasets"][key] = {
            "origin": "prepared", "documents": info.documents, "tokens": info.tokens,
            "dtype": np.dtype(info.dtype).name, "tokenizer_sha256": tok.sha256,
            "tokenizer_vocab_size": tok.vocab_size, "eod": tok.eod, "bos_prepended": False,
            "append_eod": append_eod, "tokenization": TOKENIZATION,
            "sources": _sources(out), "max_docs": out.max_docs, "skip_bad": skip_bad,
            "skipped": {"malformed": res.skipped.malformed,
                        "missing_text": res.skipped.missing_text, "empty": res.skipped.empty}}
    shutil.rmtree(_parts_dir(prefix), ignore_errors=True)
    return res


def prepare(outputs: list[Output], tokenizer: str | Path, *, data_dir: str | Path,
            workers: int | None = None, skip_bad: bool = False, progress: bool = True,
            force: bool = False, append_eod: bool = False,
            manifest: str | Path | None = None) -> list[Result]:
    """Build every output (skipping those already complete and recorded in the manifest).
    `append_eod`: end every document with the eos id (the reference does not). `manifest`: the
    manifest file (default DATA_DIR/manifest.json)."""
    # imported before workers fork, so each does not pay megatron's import again
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # noqa: F401
    tok = SentencePieceTokenizer(tokenizer)
    data_dir = Path(data_dir)
    workers = max(1, workers or len(os.sched_getaffinity(0)))
    for out in outputs:
        if not out.inputs:
            raise DataError(f"{out.prefix}: no input shards given")
        for p in out.inputs:
            if not Path(p).is_file():
                raise DataError(f"{p}: input shard not found (needed for {out.prefix.name})")
    where = mf.manifest_path(data_dir, manifest)
    m = mf.load_manifest(data_dir, where)
    results: dict[int, Result] = {}
    pending: list[tuple[int, Output]] = []
    for i, out in enumerate(outputs):
        ds = None if force else _up_to_date(out, tok, data_dir, m, skip_bad, append_eod, where)
        if ds is not None:
            results[i] = Result(prefix=out.prefix, documents=ds["documents"], tokens=ds["tokens"],
                                skipped=SkipCounts(**ds.get("skipped", {})), status="up-to-date")
        else:
            out.prefix.parent.mkdir(parents=True, exist_ok=True)
            pending.append((i, out))
    units = {i: _units(i, out, tok, skip_bad, append_eod) for i, out in pending}
    recs: dict[tuple[int, int], dict] = {}
    todo: list[Unit] = []
    for i, us in units.items():
        _parts_dir(outputs[i].prefix).mkdir(parents=True, exist_ok=True)
        for u in us:
            rec = None if force else _part_done(u)
            if rec is not None:
                recs[(u.out, u.part)] = rec
            else:
                todo.append(u)
    todo.sort(key=lambda u: -u.size())
    if todo:
        texts = (sample_texts(todo[0].inputs[0], skip_bad=skip_bad)
                 if (tok.path.parent / "tokenizer.json").is_file() else [])
        note = check_tokenizer_json(tok, texts)
        if progress:
            print(f"tokenizer: {note}", file=sys.stderr)
        _run(todo, recs, workers, progress, tok)
    for i, out in pending:
        us = units[i]
        res = _merge(out, us, [recs[(u.out, u.part)] for u in us], tok, data_dir, skip_bad,
                     append_eod, where)
        if len(todo) < sum(len(x) for x in units.values()):
            res.status = "resumed"
        results[i] = res
    return [results[i] for i in range(len(outputs))]


def _run(todo: list[Unit], recs: dict, workers: int, show: bool, tok) -> None:
    total = sum(u.size() for u in todo)
    names = sorted({u.part_prefix.parent.name.removesuffix(".parts") for u in todo})
    label = names[0] if len(names) == 1 else f"{len(names)} datasets"
    bar = Progress(f"prepare {label}", total) if show else None
    live: dict[tuple[int, int], tuple[int, int, int]] = {}
    errors: dict[tuple[int, int], DataError] = {}

    def on_report(out, part, docs, tokens, nbytes) -> None:
        live[(out, part)] = (docs, tokens, nbytes)
        if bar:
            bar.update(docs=sum(v[0] for v in live.values()),
                       tokens=sum(v[1] for v in live.values()),
                       done_bytes=sum(v[2] for v in live.values()))

    inherit_tokenizer(tok)  # the forked workers use the loaded model instead of loading it again
    if workers == 1 or len(todo) == 1:
        for u in todo:
            try:
                recs[(u.out, u.part)] = run_unit(u, on_report)
            except DataError as e:
                errors[(u.out, u.part)] = e
    else:
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        with ctx.Pool(min(workers, len(todo)), initializer=init_worker, initargs=(q,)) as pool:
            def finished(key):  # wakes the loop below the moment a unit ends, with its key
                return lambda _: q.put(("done", key))
            jobs = {(u.out, u.part): pool.apply_async(run_unit, (u,),
                                                      callback=finished((u.out, u.part)),
                                                      error_callback=finished((u.out, u.part)))
                    for u in todo}
            while jobs:
                done = []
                try:
                    msg = q.get(timeout=1.0)
                    if msg[0] == "done":
                        done.append(msg[1])  # its get() below waits the instant until ready
                    else:
                        on_report(*msg)
                except queue_mod.Empty:
                    pass
                for k in done + [k for k, j in jobs.items() if j.ready() and k not in done]:
                    if k not in jobs:
                        continue
                    try:
                        recs[k] = jobs.pop(k).get()  # re-raises a worker's exception here
                    except DataError as e:
                        errors[k] = e
            while True:
                try:
                    msg = q.get_nowait()
                except queue_mod.Empty:
                    break
                if msg[0] != "done":
                    on_report(*msg)
    if bar:
        bar.close()
    if errors:  # every other shard is finished and kept: a rerun resumes after the fix
        first = errors[min(errors)]
        more = f" (and {len(errors) - 1} more failed units)" if len(errors) > 1 else ""
        raise DataError(f"{first}{more}")


def describe(results: list[Result], stream=None) -> None:
    stream = stream or sys.stderr
    for r in results:
        skip = r.skipped
        extra = (f", skipped {skip.malformed} malformed + {skip.missing_text} without text"
                 if skip.malformed or skip.missing_text else "")
        print(f"{r.status:10s} {r.prefix}: {r.documents} documents, {r.tokens} tokens{extra}",
              file=stream)

