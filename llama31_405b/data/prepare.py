"""Tokenize C4-format shards into Megatron indexed datasets (.bin/.idx), in parallel, resumably.

Each output dataset is built from its input shards in the order given; documents keep their
order in the shard and hold the ids of the reference's tokenizer path (tokenizer.py), with no BOS
and no EOD, as the MLPerf reference prepares its data (mlcommons/training,
`large_language_model_pretraining/nemo/utils/preprocess.sh` runs NeMo's
`preprocess_data_for_megatron.py` without `--append-eod`). `append_eod=True` (`data prepare
--append-eod`) appends the tokenizer's eos id after every document instead; the manifest records
which. A unit is one input shard, or consecutive small shards together up to
`unit.GROUP_BYTES` of input (an output with `max_docs`, the validation set, is one unit that
reads its shards in order until it has that many documents), and one part,
`PREFIX.parts/part-NNNNN.{bin,idx}` (NNNNN: its first shard's index); but the work is spread
finer than that: the main process reads the units' shards as blocks of lines (~512 KB) that a
pool of worker processes parse and tokenize (a small shard's short blocks several to a task),
and writes the results in reading order into each unit's part (unit.py), so every worker has
work until the last block, however few and unequal the shards. A finished part is
renamed from temporary names and marked by `part-NNNNN.json` (the unit's shards, their sizes
and the options), so an interrupted run resumes at the first unfinished unit; a unit stops at its
first failing shard. When every part of an output is done they are concatenated in order
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
import shutil
import sys
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import manifest as mf
from .errors import DataError
from .indexed import read_index, token_dtype
from .parity import check_tokenizer_json, sample_texts
from .progress import Progress
from .reader import BlockReader, SkipCounts
from .tokenizer import TOKENIZATION, SentencePieceTokenizer
from . import unit as unit_mod
from .unit import Block, PartWriter, Unit, inherit_tokenizer, tokenize_blocks

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
    groups = ([range(len(out.inputs))] if out.max_docs is not None else
              unit_mod.group_inputs([p.stat().st_size for p in out.inputs]))
    return [Unit(out=i, part=g.start, inputs=out.inputs[g.start:g.stop], max_docs=out.max_docs,
                 skip_bad=skip_bad, tokenizer=str(tok.path), tokenizer_sha256=tok.sha256,
                 part_prefix=parts / f"part-{g.start:05d}", append_eod=append_eod)
            for g in groups]


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


class _Now:
    """A result computed on the spot (no pool): a Future's result()."""

    def __init__(self, value: list[Block]) -> None:
        self.value = value

    def result(self) -> list[Block]:
        return self.value


class _Slot:
    """One block's result within a task of several blocks (set when the task is submitted)."""

    def __init__(self) -> None:
        self.task: Future[list[Block]] | _Now | None = None
        self.index = 0

    def get(self) -> Block:
        # _run's handle submits the pending batch before it reads a block of it
        assert self.task is not None, "a block read before its task was submitted"
        return self.task.result()[self.index]


def _blocks(todo: list[Unit], closed: set):
    """Everything the units' inputs hold, in reading order: ("block", unit, path, first line,
    data, input bytes read), ("end", unit, path, lines) after each shard, ("fail", unit,
    DataError) at a damaged stream, ("done", unit). A unit in `closed` (failed, or max_docs
    reached) is not read further."""
    before = 0
    for u in todo:
        k = (u.out, u.part)
        for path in u.inputs:
            if k in closed:
                break
            reader = BlockReader(path, unit_mod.BLOCK_BYTES)
            try:
                for first, data in reader:
                    yield "block", u, path, first, data, before + reader.position
                    if k in closed:
                        break
            except DataError as e:
                yield "fail", u, e
                break
            finally:
                before += path.stat().st_size
            yield "end", u, path, reader.lines
        yield "done", u


def _run(todo: list[Unit], recs: dict, workers: int, show: bool, tok) -> None:
    """Tokenize the units: their blocks of lines go to `workers` processes as they are read, the
    results are written in reading order (unit.PartWriter), at most a few blocks per worker
    ahead of the writing."""
    total = sum(u.size() for u in todo)
    names = sorted({u.part_prefix.parent.name.removesuffix(".parts") for u in todo})
    label = names[0] if len(names) == 1 else f"{len(names)} datasets"
    bar = Progress(f"prepare {label}", total) if show else None
    errors: dict[tuple[int, int], DataError] = {}
    writers: dict[tuple[int, int], PartWriter] = {}
    closed: set[tuple[int, int]] = set()
    docs = tokens = 0
    inherit_tokenizer(tok)  # forked workers use the loaded model instead of loading it again
    # inputs of about one block gain nothing from a pool (json.gz: ~1/4 of the text's size)
    # concurrent.futures, not multiprocessing.Pool: a worker that dies (killed for memory, a
    # signal) fails every pending task with BrokenProcessPool, where Pool loses its task and
    # waits for it forever
    # fork only a single-threaded process (the CLI's): a fork copies the locks other threads hold
    # at that moment, held forever in the child (a worker forked from a process running gloo's
    # threads hung so). Otherwise spawned workers, which load the tokenizer themselves; not the
    # forkserver: it is one per process, and starting it here would start it without the
    # modules a later caller asks it to preload
    start = "fork" if len(os.listdir("/proc/self/task")) == 1 else "spawn"
    pool = (ProcessPoolExecutor(workers, mp_context=mp.get_context(start))
            if workers > 1 and total > unit_mod.BLOCK_BYTES // 4 else None)
    path_tok = str(tok.path)

    # Blocks go to the workers in tasks of about BLOCK_BYTES: a large shard's blocks one by one,
    # a small shard's (one short block each) several together. A task costs the main process
    # ~1 ms beside its bytes (the pool's threads, measured: 262 one-shard tasks on the bench's
    # 256 small shards took 0.2 s more of its CPU than 66 full blocks of the same text).
    batch: list[tuple[bytes, bool, bool]] = []
    slots: list[_Slot] = []

    def submit(u: Unit, data: bytes) -> _Slot:
        batch.append((data, u.skip_bad, u.append_eod))
        slots.append(_Slot())
        slot = slots[-1]
        if sum(len(b[0]) for b in batch) >= unit_mod.BLOCK_BYTES:
            flush()
        return slot

    def flush() -> None:
        if not batch:
            return
        args = (path_tok, list(batch))
        task = pool.submit(tokenize_blocks, *args) if pool else _Now(tokenize_blocks(*args))
        for i, slot in enumerate(slots):
            slot.task, slot.index = task, i
        batch.clear()
        slots.clear()

    def close(k, w: PartWriter, error: DataError | None = None) -> None:
        if error is None:
            try:
                recs[k] = w.finish()
            except DataError as e:
                error = e
        closed.add(k)
        del writers[k]
        if error is not None:
            w.abort()
            errors[k] = error

    def handle(item) -> None:
        nonlocal docs, tokens
        kind, u = item[0], item[1]
        k = (u.out, u.part)
        if k in closed:
            return
        w = writers.get(k) or writers.setdefault(k, PartWriter(u, tok.vocab_size))
        try:
            if kind == "block":
                _, _, path, first, _, pos, result = item
                if result.task is None:
                    flush()
                d0, t0 = w.docs, w.tokens
                w.add(path, first, result.get())
                docs, tokens = docs + w.docs - d0, tokens + w.tokens - t0
                if bar:
                    bar.update(docs=docs, tokens=tokens, done_bytes=pos)
                if w.full:
                    w.end_shard(path, 0)
                    close(k, w)
            elif kind == "end":
                w.end_shard(item[2], item[3])
            elif kind == "fail":
                raise item[2]
            else:
                close(k, w)
        except DataError as e:
            close(k, w, e)

    # Blocks in flight (submitted, not yet written): a few blocks' worth per worker, so a worker
    # that finishes one finds the next already queued. Counted in blocks and bytes, not items:
    # with one-block shards every block comes with an "end" and a "done" item, and the former
    # window of 3 x workers items held about one block per worker, so each worker idled while the
    # main process wrote a result and read the next shard (measured on 256 small shards: a worker
    # starved before ~95% of its blocks). Small blocks (small shards) count by their bytes;
    # the window includes the blocks not yet sent (less than one task's worth).
    window, window_bytes = 3 * workers, 3 * workers * unit_mod.BLOCK_BYTES
    pending: deque = deque()
    blocks = size = 0
    try:
        for item in _blocks(todo, closed):
            if item[0] == "block":
                item = (*item, submit(item[1], item[4]))
                blocks, size = blocks + 1, size + len(item[4])
            pending.append(item)
            while blocks >= window and size >= window_bytes:
                done = pending.popleft()
                if done[0] == "block":
                    blocks, size = blocks - 1, size - len(done[4])
                handle(done)
        while pending:
            handle(pending.popleft())
    except BrokenProcessPool as e:
        raise DataError(f"data prepare: a tokenizer worker process died ({e}); killed for memory "
                        f"or by a signal? (dmesg says which). The parts finished so far are "
                        f"kept: rerun to resume, with fewer --workers if memory ran out") from None
    finally:
        for w in writers.values():
            w.abort()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    if bar:
        bar.close()
    if errors:  # every other unit is finished and kept: a rerun resumes after the fix
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

