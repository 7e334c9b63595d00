"""data prepare splits shards into blocks of lines tokenized by the worker pool: its output is
byte for byte what the one-unit-per-shard implementation wrote (before blocks), and its errors
read the same, file and line included.

The reference below is that implementation's semantics written out sequentially: each shard read
by `ShardReader` (GzipFile's line iterator, as before), each text tokenized on its own, each
document written by megatron-core's own `IndexedDatasetBuilder.add_document`, the empty-shard and
too-few-documents errors worded as before, the first failing unit's error reported. It passed
against the pre-block implementation (commit 354fccb) before the change, and passes now, on
unequal inputs, several shards, blocks much smaller than a shard and lines longer than a block,
bad lines (skipped and counted, or failing), truncated and corrupt gzip, a shard without a
trailing newline, max_docs cutting inside a block, and append_eod. Small consecutive shards now
share a unit (unit.GROUP_BYTES): the output is the same bytes, and a unit still stops at its first
failing shard, so where two failing shards share a unit one error is counted, not two; the
reference forms units by the same rule, and every test runs with one shard per unit too."""
from __future__ import annotations

import gzip
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from data_helpers import make_tokenizer, texts
from llama31_405b.data import DataError
from llama31_405b.data import prepare as prepare_mod
from llama31_405b.data import unit as unit_mod
from llama31_405b.data.indexed import token_dtype
from llama31_405b.data.manifest import load_manifest
from llama31_405b.data.prepare import Output, prepare
from llama31_405b.data.reader import BlockReader, ShardReader, SkipCounts
from llama31_405b.data.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("blocks")
    docs = texts()
    return root, docs, make_tokenizer(root / "tok.model", docs)


def _write(path: Path, lines: list[str], *, newline_at_end: bool = True, gz: bool = True) -> Path:
    data = "\n".join(lines) + ("\n" if newline_at_end else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                    mtime=0) as f:
            f.write(data.encode())
    else:
        path.write_text(data)
    return path


def _doc(t: str) -> str:
    return json.dumps({"text": t, "timestamp": "2019-04-25T00:00:00Z", "url": "u"})


def _unit_docs(paths, max_docs, skip_bad, tok, append_eod):
    """The documents and skip counts of one unit, as the per-shard implementation made them."""
    docs: list[list[int]] = []
    skipped = SkipCounts()
    taken = 0
    for path in paths:
        reader = ShardReader(path, skip_bad=skip_bad)
        n = 0
        for text in reader:
            n += 1
            taken += 1
            ids = tok.tokenize(text)
            if not ids:
                skipped.empty += 1
            else:
                docs.append(ids + [tok.eod] if append_eod else ids)
            if taken == max_docs:
                break
        skipped.add(reader.counts)
        if n == 0:
            c = reader.counts
            raise DataError(f"{path}: empty shard (no documents in {reader.lines} lines"
                            + (f"; skipped {c.malformed} malformed, {c.missing_text} without "
                               f"text, {c.empty} empty" if c.total() else "")
                            + "); remove it from the inputs or copy it again")
        if taken == max_docs:
            break
    if max_docs is not None and taken < max_docs:
        raise DataError(f"{', '.join(str(p) for p in paths)}: only {taken} documents, "
                        f"{max_docs} requested; add the following shards to the inputs")
    return docs, skipped


def _groups(paths, max_docs):
    """The units: all shards with max_docs; else a shard of GROUP_BYTES or more alone, smaller
    consecutive ones together until they hold GROUP_BYTES, never across a multiple of
    GROUP_WINDOW shards (GROUP_BYTES 0: one shard each, as before units could hold several)."""
    if max_docs is not None:
        return [tuple(paths)]
    limit, window = unit_mod.GROUP_BYTES, unit_mod.GROUP_WINDOW
    groups, group = [], []
    for i, p in enumerate(paths):
        if group and (i % window == 0 or p.stat().st_size >= limit):
            groups.append(tuple(group))
            group = []
        group.append(p)
        if sum(q.stat().st_size for q in group) >= limit:
            groups.append(tuple(group))
            group = []
    return groups + ([tuple(group)] if group else [])


def reference(out: Output, tok_path: Path, tmp: Path, *, skip_bad=False, append_eod=False):
    """(.bin bytes, .idx bytes, skip counts) of `out`, or the DataError the run ends with."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    tok = load_tokenizer(tok_path)
    groups = _groups(out.inputs, out.max_docs)
    results, errors = [], []
    for g in groups:
        try:
            results.append(_unit_docs(g, out.max_docs, skip_bad, tok, append_eod))
        except DataError as e:
            errors.append(e)
    if errors:
        more = f" (and {len(errors) - 1} more failed units)" if len(errors) > 1 else ""
        return DataError(f"{errors[0]}{more}")
    dtype = token_dtype(tok.vocab_size)
    b = IndexedDatasetBuilder(str(tmp / "ref.bin"), dtype=dtype)
    skipped = SkipCounts()
    for docs, sk in results:
        skipped.add(sk)
        for d in docs:
            b.add_document(np.array(d, dtype=dtype), [len(d)])
    b.finalize(str(tmp / "ref.idx"))
    return ((tmp / "ref.bin").read_bytes(), (tmp / "ref.idx").read_bytes(),
            {"malformed": skipped.malformed, "missing_text": skipped.missing_text,
             "empty": skipped.empty})


def _compare(out, tok_path, tmp, *, workers, skip_bad=False, append_eod=False):
    want = reference(out, tok_path, tmp, skip_bad=skip_bad, append_eod=append_eod)
    if isinstance(want, DataError):
        with pytest.raises(DataError) as got:
            prepare([out], tok_path, data_dir=out.prefix.parent, workers=workers,
                    progress=False, skip_bad=skip_bad, append_eod=append_eod, force=True)
        assert str(got.value) == str(want)
        return None
    [res] = prepare([out], tok_path, data_dir=out.prefix.parent, workers=workers,
                    progress=False, skip_bad=skip_bad, append_eod=append_eod, force=True)
    assert Path(f"{out.prefix}.bin").read_bytes() == want[0]
    assert Path(f"{out.prefix}.idx").read_bytes() == want[1]
    rec = load_manifest(out.prefix.parent)["datasets"][out.prefix.name]
    assert rec["skipped"] == want[2]
    assert res.documents == rec["documents"]
    return res


def _unequal(root: Path, docs: list[str], sizes=(3, 61, 17, 120, 1, 38)) -> list[Path]:
    paths, at = [], 0
    for i, n in enumerate(sizes):
        paths.append(_write(root / f"c4-train.{i:05d}-of-{len(sizes):05d}.json.gz",
                            [_doc(t) for t in docs[at:at + n]]))
        at += n
    return paths




@pytest.fixture(params=[(1, 700, 0), (2, 64, 0), (2, 700, 20_000), (2, 1 << 19, None)],
                ids=lambda p: f"workers{p[0]}-block{p[1]}-group{p[2]}")
def setting(request, monkeypatch):
    """Workers, block bytes, and unit bytes: 0 one shard per unit (as with C4's large shards),
    20,000 two shards a unit in `_unequal`, None the default (every small shard here in one)."""
    workers, block, group = request.param
    monkeypatch.setattr(unit_mod, "BLOCK_BYTES", block, raising=False)
    if group is not None:
        monkeypatch.setattr(unit_mod, "GROUP_BYTES", group)
    return workers


def test_unequal_shards_byte_equal(env, tmp_path, setting):
    _, docs, tok_path = env
    out = Output(prefix=tmp_path / "ds" / "t_text_document",
                 inputs=tuple(_unequal(tmp_path / "raw", docs)))
    _compare(out, tok_path, tmp_path, workers=setting)
    eod = Output(prefix=tmp_path / "ds" / "e_text_document", inputs=out.inputs)
    _compare(eod, tok_path, tmp_path, workers=setting, append_eod=True)


def _with_bad_lines(root: Path, docs: list[str]) -> list[Path]:
    bad = ["{not json", json.dumps({"url": "x"}), json.dumps({"text": 7}), json.dumps(["text"]),
           _doc(""), "", "   ", '{"text": "unterminated']
    a = [_doc(t) for t in docs[:40]]
    a[3:3] = bad[:2]
    a[30:30] = bad[2:5]
    b = [_doc(t) for t in docs[40:45]] + bad[5:7] + [_doc(t) for t in docs[45:140]] + bad[7:]
    c = [_doc(t) for t in docs[140:150]]
    return [_write(root / "a.json.gz", a), _write(root / "b.json.gz", b),
            _write(root / "c.json", c, newline_at_end=False, gz=False)]


def test_bad_lines_skipped_and_counted_or_failing_with_file_and_line(env, tmp_path, setting):
    _, docs, tok_path = env
    paths = _with_bad_lines(tmp_path / "raw", docs)
    out = Output(prefix=tmp_path / "ds" / "b_text_document", inputs=tuple(paths))
    res = _compare(out, tok_path, tmp_path, workers=setting, skip_bad=True)
    assert res.skipped.malformed == 2 and res.skipped.missing_text == 3 and res.skipped.empty == 1
    # two failing shards: a.json.gz:4 first; "(and 1 more failed units)" when they are two units
    _compare(out, tok_path, tmp_path, workers=setting)
    # only the last line of the middle shard is bad: its line number lies in a later block
    late = Output(prefix=tmp_path / "ds" / "l_text_document", inputs=(paths[0], paths[1]))
    _write(paths[0], [_doc(t) for t in docs[:40]])
    with pytest.raises(DataError, match=r"b\.json\.gz:103: malformed JSON line"):
        prepare([late], tok_path, data_dir=tmp_path / "ds", workers=setting, progress=False)
    _compare(late, tok_path, tmp_path, workers=setting)


def test_damaged_gzip_and_empty_shards(env, tmp_path, setting):
    _, docs, tok_path = env
    paths = _unequal(tmp_path / "raw", docs)
    raw = paths[3].read_bytes()
    paths[3].write_bytes(raw[: len(raw) * 2 // 3])  # truncated
    out = Output(prefix=tmp_path / "ds" / "g_text_document", inputs=tuple(paths))
    _compare(out, tok_path, tmp_path, workers=setting)
    corrupt = bytearray(raw)
    corrupt[len(raw) // 2: len(raw) // 2 + 8] = b"\xff" * 8
    paths[3].write_bytes(bytes(corrupt))
    _compare(out, tok_path, tmp_path, workers=setting)
    paths[3].write_bytes(raw)
    _write(paths[1], ["", _doc(""), "{bad"])
    _compare(out, tok_path, tmp_path, workers=setting, skip_bad=True)  # empty shard


@pytest.mark.parametrize("max_docs", [1, 2, 70, 100, 240])
def test_max_docs_cut_inside_a_block(env, tmp_path, setting, max_docs):
    """The validation set: the first max_docs documents over the shards in order; a bad line or
    a damaged stream after the cut is never read, as before."""
    _, docs, tok_path = env
    paths = _unequal(tmp_path / "raw", docs, sizes=(2, 61, 30, 7))
    with_bad = [_doc(t) for t in docs[63:93]]
    with_bad[12:12] = ["{bad", _doc("")]
    _write(paths[2], with_bad)
    raw = paths[3].read_bytes()
    paths[3].write_bytes(raw[: len(raw) // 2])
    out = Output(prefix=tmp_path / "ds" / "v_text_document", inputs=tuple(paths),
                 max_docs=max_docs)
    _compare(out, tok_path, tmp_path, workers=setting)
    _compare(out, tok_path, tmp_path, workers=setting, skip_bad=True)
    intact = Output(prefix=tmp_path / "ds" / "i_text_document", inputs=tuple(paths[:3]),
                    max_docs=max_docs)  # 93 documents: "only 93 documents" from 100 on
    _compare(intact, tok_path, tmp_path, workers=setting, skip_bad=True)


def test_block_reader_yields_whole_lines_with_their_numbers(tmp_path):
    """Blocks end at a newline, hold every byte once, and number their first line; a line longer
    than a block is one block; a damaged stream ends with ShardReader's error after the lines
    before the damage."""
    lines = ["x" * (i * 997 % 5000) for i in range(400)] + ["y" * 100_000, "", "last"]
    path = _write(tmp_path / "s.json.gz", lines, newline_at_end=False)
    reader = BlockReader(path, 4096)
    blocks = list(reader)
    assert len(blocks) > 20 and reader.lines == len(lines)
    assert b"".join(b for _, b in blocks) == "\n".join(lines).encode()
    line = 1
    for first, b in blocks[:-1]:
        assert first == line and b.endswith(b"\n")
        line += b.count(b"\n")
    assert blocks[-1] == (len(lines), b"last")
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 3])
    got = []
    with pytest.raises(DataError) as e:
        for _, b in BlockReader(path, 4096):
            got.append(b)
    with pytest.raises(DataError) as want:
        list(ShardReader(path, skip_bad=True))
    assert str(e.value) == str(want.value) and "truncated gzip stream" in str(e.value)
    n = b"".join(got).count(b"\n")
    assert f"s.json.gz:{n + 1}: truncated gzip stream after {n} complete lines" in str(e.value)


def _dies_at_marker(tokenizer, blocks):
    """prepare's task, except that the worker is killed (as the kernel kills for memory) when a
    block holds the marker document."""
    if any(b"KILL-THIS-WORKER" in b[0] for b in blocks):
        os.kill(os.getpid(), signal.SIGKILL)
    return unit_mod.tokenize_blocks(tokenizer, blocks)


def test_a_worker_killed_mid_run_is_an_error_and_a_rerun_resumes(env, tmp_path, monkeypatch):
    """No wait for a task that will never finish: a tokenizer worker killed while the run goes on
    stops it with an error that says so; the rerun resumes and writes what a clean run writes."""
    _, docs, tok_path = env
    monkeypatch.setattr(unit_mod, "BLOCK_BYTES", 700, raising=False)
    monkeypatch.setattr(unit_mod, "GROUP_BYTES", 0)
    paths = _unequal(tmp_path / "raw", docs)
    clean = paths[3].read_bytes()
    _write(paths[3], [_doc(t) for t in docs[81:120]] + [_doc("KILL-THIS-WORKER")])
    out = Output(prefix=tmp_path / "ds" / "k_text_document", inputs=tuple(paths))
    monkeypatch.setattr(prepare_mod, "tokenize_blocks", _dies_at_marker)
    with pytest.raises(DataError, match=r"a tokenizer worker process died .*rerun to resume"):
        prepare([out], tok_path, data_dir=out.prefix.parent, workers=2, progress=False)
    assert not list((tmp_path / "ds").glob("**/*.tmp.*"))
    monkeypatch.setattr(prepare_mod, "tokenize_blocks", unit_mod.tokenize_blocks)
    paths[3].write_bytes(clean)
    [res] = prepare([out], tok_path, data_dir=out.prefix.parent, workers=2, progress=False)
    want = reference(out, tok_path, tmp_path)
    assert res.status == "resumed"
    assert Path(f"{out.prefix}.bin").read_bytes() == want[0]
    assert Path(f"{out.prefix}.idx").read_bytes() == want[1]
