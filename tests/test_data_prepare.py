"""data prepare: text -> .bin/.idx equals direct tokenization, order, idempotence, resume,
bad input (each fails with file and line, or is skipped and counted on request), no partial
dataset that looks complete."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from data_helpers import make_tokenizer, texts, truncate, write_shard
from llama31_405b.cli import main as cli_main
from llama31_405b.data import DataError
from llama31_405b.data import prepare as prep_mod
from llama31_405b.data.indexed import read_index
from llama31_405b.data.manifest import load_manifest
from llama31_405b.data.prepare import Output, prepare
from llama31_405b.data.progress import Progress
from llama31_405b.data.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    docs = texts()
    tok = make_tokenizer(root / "tok.model", docs)
    return root, docs, tok


def _shards(dirpath: Path, docs: list[str], n: int = 3) -> list[Path]:
    step = -(-len(docs) // n)
    return [write_shard(dirpath / f"c4-train.{i:05d}-of-{n:05d}.json.gz", docs[i * step:(i + 1) * step])
            for i in range(n)]


def _documents(prefix: Path) -> list[list[int]]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    ds = IndexedDataset(str(prefix))
    return [ds[i].tolist() for i in range(len(ds))]


def test_tokenizer_interface(env):
    _, docs, tok_path = env
    tok = load_tokenizer(tok_path)
    assert (tok.vocab_size, tok.bos, tok.eod, tok.pad) == (600, 1, 2, -1)
    assert tok.unique_identifiers["sha256"] == tok.sha256
    ids = tok.tokenize(docs[0])
    assert ids and tok.bos not in ids[:1] and tok.eod not in ids
    assert tok.detokenize(ids) == docs[0]
    with pytest.raises(DataError, match="nope.model: file not found"):
        load_tokenizer(tok_path.parent / "nope.model")


def test_roundtrip_order_and_idempotent(env, tmp_path):
    _, docs, tok_path = env
    tok = load_tokenizer(tok_path)
    shards = _shards(tmp_path / "raw", docs)
    out = Output(prefix=tmp_path / "ds" / "train_text_document", inputs=tuple(shards))
    [res] = prepare([out], tok_path, data_dir=tmp_path / "ds", workers=2, progress=False)
    assert res.status == "prepared" and res.documents == len(docs)
    # documents in shard then line order, each = its tokenization, no BOS, no EOD (reference)
    assert _documents(out.prefix) == [tok.tokenize(t) for t in docs]
    info = read_index(out.prefix)
    assert info.dtype == np.uint16 and info.tokens == res.tokens
    m = load_manifest(tmp_path / "ds")
    rec = m["datasets"]["train_text_document"]
    assert rec["tokenizer_sha256"] == tok.sha256 and rec["bos_prepended"] is False
    assert rec["append_eod"] is False
    assert m["files"]["train_text_document.bin"]["size"] == info.bin_size
    assert not Path(f"{out.prefix}.parts").exists()
    before = Path(f"{out.prefix}.bin").stat().st_mtime_ns
    [again] = prepare([out], tok_path, data_dir=tmp_path / "ds", workers=2, progress=False)
    assert again.status == "up-to-date" and again.tokens == res.tokens
    assert Path(f"{out.prefix}.bin").stat().st_mtime_ns == before


def test_resume_after_a_bad_shard(env, tmp_path, monkeypatch):
    from llama31_405b.data import unit as unit_mod
    monkeypatch.setattr(unit_mod, "GROUP_BYTES", 0)  # one unit per shard, as with C4's shards
    _, docs, tok_path = env
    shards = _shards(tmp_path / "raw", docs)
    good = shards[2].read_bytes()
    truncate(shards[2])  # units run largest first: this one may run first or last
    out = Output(prefix=tmp_path / "ds" / "x_text_document", inputs=tuple(shards))
    with pytest.raises(DataError, match=r"c4-train\.00002-of-00003\.json\.gz:\d+: truncated gzip"):
        prepare([out], tok_path, data_dir=tmp_path / "ds", workers=1, progress=False)
    # never a dataset that looks complete; finished shards are kept for the resume
    assert not Path(f"{out.prefix}.bin").exists() and not Path(f"{out.prefix}.idx").exists()
    assert sorted(p.name for p in Path(f"{out.prefix}.parts").glob("*.json")) == [
        "part-00000.json", "part-00001.json"]
    shards[2].write_bytes(good)
    [res] = prepare([out], tok_path, data_dir=tmp_path / "ds", workers=1, progress=False)
    assert res.status == "resumed"
    fresh = Output(prefix=tmp_path / "ds" / "y_text_document", inputs=tuple(shards))
    prepare([fresh], tok_path, data_dir=tmp_path / "ds", workers=1, progress=False)
    assert Path(f"{out.prefix}.bin").read_bytes() == Path(f"{fresh.prefix}.bin").read_bytes()
    assert Path(f"{out.prefix}.idx").read_bytes() == Path(f"{fresh.prefix}.idx").read_bytes()


def test_small_shards_share_a_unit_and_resume_by_unit(env, tmp_path, monkeypatch):
    """Consecutive shards smaller than GROUP_BYTES share a unit and a part, named after its first
    shard, whose record names them; a failing shard fails its unit only, and the rerun redoes
    only that unit's shards, for the same bytes as a run in one go with a part per shard."""
    from llama31_405b.data import unit as unit_mod
    _, docs, tok_path = env
    shards = _shards(tmp_path / "raw", docs, n=6)
    sizes = [p.stat().st_size for p in shards]
    assert 2 * min(sizes) > max(sizes) + 1
    monkeypatch.setattr(unit_mod, "GROUP_BYTES", max(sizes) + 1)  # two shards a unit
    good = shards[3].read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2: len(bad) // 2 + 8] = b"\xff" * 8  # corrupt, same size: the same units
    shards[3].write_bytes(bytes(bad))
    out = Output(prefix=tmp_path / "ds" / "g_text_document", inputs=tuple(shards))
    with pytest.raises(DataError, match=r"c4-train\.00003-of-00006\.json\.gz:\d+: ") as e:
        prepare([out], tok_path, data_dir=tmp_path / "ds", workers=1, progress=False)
    assert "more failed units" not in str(e.value)
    parts = Path(f"{out.prefix}.parts")
    assert sorted(p.name for p in parts.glob("*.json")) == ["part-00000.json", "part-00004.json"]
    rec = json.loads((parts / "part-00004.json").read_text())
    assert rec["inputs"] == [[p.name, p.stat().st_size] for p in shards[4:]]
    assert not Path(f"{out.prefix}.bin").exists()
    shards[3].write_bytes(good)
    read: list[bytes] = []
    tokenize = unit_mod.tokenize_block  # one worker: run in this process
    monkeypatch.setattr(unit_mod, "tokenize_block",
                        lambda tok, data, *a: (read.append(data), tokenize(tok, data, *a))[1])
    [res] = prepare([out], tok_path, data_dir=tmp_path / "ds", workers=1, progress=False)
    assert res.status == "resumed" and res.documents == len(docs)
    assert b"".join(read) == b"".join(gzip.decompress(p.read_bytes()) for p in shards[2:4])
    monkeypatch.setattr(unit_mod, "tokenize_block", tokenize)
    monkeypatch.setattr(unit_mod, "GROUP_BYTES", 0)
    fresh = Output(prefix=tmp_path / "ds" / "f_text_document", inputs=tuple(shards))
    prepare([fresh], tok_path, data_dir=tmp_path / "ds", workers=2, progress=False)
    assert Path(f"{out.prefix}.bin").read_bytes() == Path(f"{fresh.prefix}.bin").read_bytes()
    assert Path(f"{out.prefix}.idx").read_bytes() == Path(f"{fresh.prefix}.idx").read_bytes()


def test_units_of_small_shards_stay_within_their_window(monkeypatch):
    """group_inputs: large shards alone, small ones together up to GROUP_BYTES, and a shard whose
    size changes moves unit boundaries inside its window of GROUP_WINDOW shards only."""
    from llama31_405b.data import unit as unit_mod
    monkeypatch.setattr(unit_mod, "GROUP_BYTES", 100)
    monkeypatch.setattr(unit_mod, "GROUP_WINDOW", 8)

    def units(sizes):
        got = unit_mod.group_inputs(sizes)
        assert [i for r in got for i in r] == list(range(len(sizes)))  # every shard once, in order
        return [(r.start, r.stop) for r in got]

    assert units([]) == []
    assert units([500, 300]) == [(0, 1), (1, 2)]  # C4-sized shards: a unit each, as before
    assert units([30, 30, 500, 30, 30, 30, 30]) == [(0, 2), (2, 3), (3, 7)]
    assert units([60, 60, 60, 60, 100, 10]) == [(0, 2), (2, 4), (4, 5), (5, 6)]
    small = [40] * 20
    assert units(small) == [(0, 3), (3, 6), (6, 8), (8, 11), (11, 14), (14, 16), (16, 19),
                            (19, 20)]
    changed = small[:9] + [5] + small[10:]  # shard 9 damaged: only the window 8-15 changes
    assert units(changed) == [(0, 3), (3, 6), (6, 8), (8, 12), (12, 15), (15, 16), (16, 19),
                              (19, 20)]


@pytest.mark.parametrize("bad, at_line, message", [
    ("{not json", 4, r"bad\.json\.gz:4: malformed JSON line"),
    (json.dumps({"url": "x"}), 4, r'bad\.json\.gz:4: no "text" field'),
    (json.dumps({"text": 7}), 4, r'bad\.json\.gz:4: "text" is not a string'),
    (json.dumps(["text"]), 4, r"bad\.json\.gz:4: not a JSON object"),
])
def test_bad_lines_fail_with_file_and_line_or_are_counted(env, tmp_path, bad, at_line, message):
    _, docs, tok_path = env
    shard = write_shard(tmp_path / "bad.json.gz", docs[:10], extra_lines=[bad], at=at_line - 1)
    out = Output(prefix=tmp_path / "b_text_document", inputs=(shard,))
    with pytest.raises(DataError, match=message + ".*--skip-bad"):
        prepare([out], tok_path, data_dir=tmp_path, workers=1, progress=False)
    assert not Path(f"{out.prefix}.idx").exists()
    [res] = prepare([out], tok_path, data_dir=tmp_path, workers=1, progress=False, skip_bad=True)
    assert res.documents == 10 and res.skipped.malformed + res.skipped.missing_text == 1
    assert load_manifest(tmp_path)["datasets"]["b_text_document"]["skip_bad"] is True


def test_truncated_gzip_empty_shard_missing_input(env, tmp_path):
    _, docs, tok_path = env
    trunc = truncate(write_shard(tmp_path / "t.json.gz", docs[:50]))
    with pytest.raises(DataError, match=r"t\.json\.gz:\d+: truncated gzip stream.*copy it again"):
        prepare([Output(prefix=tmp_path / "t", inputs=(trunc,))], tok_path, data_dir=tmp_path,
                workers=1, progress=False, skip_bad=True)  # never skippable
    empty = write_shard(tmp_path / "e.json.gz", [])
    (tmp_path / "e.json.gz").write_bytes(__import__("gzip").compress(b"\n"))
    with pytest.raises(DataError, match=r"e\.json\.gz: empty shard"):
        prepare([Output(prefix=tmp_path / "e", inputs=(empty,))], tok_path, data_dir=tmp_path,
                workers=1, progress=False)
    with pytest.raises(DataError, match=r"missing\.json\.gz: input shard not found"):
        prepare([Output(prefix=tmp_path / "m", inputs=(tmp_path / "missing.json.gz",))],
                tok_path, data_dir=tmp_path, workers=1, progress=False)
    for stem in ("t", "e", "m"):
        assert not (tmp_path / f"{stem}.bin").exists()


def test_max_docs_and_min_tokens(env, tmp_path):
    _, docs, tok_path = env
    tok = load_tokenizer(tok_path)
    shards = _shards(tmp_path / "raw", docs[:90])
    out = Output(prefix=tmp_path / "v_text_document", inputs=tuple(shards), max_docs=45)
    [res] = prepare([out], tok_path, data_dir=tmp_path, workers=2, progress=False)
    assert _documents(out.prefix) == [tok.tokenize(t) for t in docs[:45]]
    too_many = Output(prefix=tmp_path / "w", inputs=tuple(shards), max_docs=91)
    with pytest.raises(DataError, match="only 90 documents, 91 requested"):
        prepare([too_many], tok_path, data_dir=tmp_path, workers=1, progress=False)
    short = Output(prefix=tmp_path / "s", inputs=tuple(shards), min_tokens=res.tokens * 10)
    with pytest.raises(DataError, match="eval_samples x seq_length"):
        prepare([short], tok_path, data_dir=tmp_path, workers=1, progress=False)
    assert not (tmp_path / "s.bin").exists() and not (tmp_path / "s.check.bin").exists()


def test_plain_json_input_and_cli(env, tmp_path, capsys):
    _, docs, tok_path = env
    shard = write_shard(tmp_path / "c4.json", docs[:20], gz=False)
    prefix = tmp_path / "out" / "p_text_document"
    rc = cli_main(["data", "prepare", "--input", str(shard), "--output-prefix", str(prefix),
                   "--tokenizer", str(tok_path), "--workers", "1"])
    cap = capsys.readouterr()
    assert rc == 0 and "prepared" in cap.out and "docs/s" in cap.err and "tok/s" in cap.err
    assert read_index(prefix).documents == 20
    bad = write_shard(tmp_path / "bad.json", docs[:3], extra_lines=["oops"], at=1, gz=False)
    rc = cli_main(["data", "prepare", "--input", str(bad), "--output-prefix", str(prefix) + "2",
                   "--tokenizer", str(tok_path), "--no-progress"])
    assert rc == 2 and "bad.json:2: malformed JSON" in capsys.readouterr().err


def test_progress_line():
    import io
    p = Progress("prepare x", 1000, stream=io.StringIO(), interval=0)
    p.start -= 10
    p.update(docs=500, tokens=200_000, done_bytes=250)
    line = p.line()
    assert "25.0%" in line and "50 docs/s" in line and "20.00k tok/s" in line
    assert "ETA 0:00:30" in line


def test_benchmark_layout(tmp_path):
    from llama31_405b.config import load_config
    from llama31_405b.data.layout import VALID_DOCS, benchmark_outputs
    repo = Path(__file__).resolve().parents[1]
    cfg = load_config(repo / "configs" / "config_GB200_2048x4x8xtp4pp8cp2.toml")
    cfg.data.data_dir = str(tmp_path / "data")
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(768, 1024):
        (raw / f"c4-train.{i:05d}-of-01024.json.gz").touch()
    with pytest.raises(DataError, match=r"c4-validation\.00000-of-00008\.json\.gz"):
        benchmark_outputs(cfg, raw)
    for i in range(3):
        (raw / f"c4-validation.{i:05d}-of-00008.json.gz").touch()
    en6, en7, valid = benchmark_outputs(cfg, raw)
    assert en6.prefix.name == "c4-train.en_6_text_document"
    assert [p.name for p in en6.inputs][::127] == ["c4-train.00768-of-01024.json.gz",
                                                   "c4-train.00895-of-01024.json.gz"]
    assert [p.name for p in en7.inputs][::127] == ["c4-train.00896-of-01024.json.gz",
                                                   "c4-train.01023-of-01024.json.gz"]
    assert valid.prefix.name == "c4-validation-91205-samples.en_text_document"
    assert valid.max_docs == VALID_DOCS == 91205 and len(valid.inputs) == 3
    assert valid.min_tokens == 5760 * 8192 + 1
    (raw / "c4-train.00900-of-01024.json.gz").unlink()
    with pytest.raises(DataError, match=r"1 raw C4 shards missing, e\.g\. .*00900-of-01024"):
        benchmark_outputs(cfg, raw)


def test_append_eod_is_an_explicit_option(env, tmp_path, capsys):
    _, docs, tok_path = env
    tok = load_tokenizer(tok_path)
    shard = write_shard(tmp_path / "c4.json.gz", docs[:30])
    prefix = tmp_path / "out" / "e_text_document"
    args = ["data", "prepare", "--input", str(shard), "--output-prefix", str(prefix),
            "--tokenizer", str(tok_path), "--workers", "1", "--no-progress"]
    assert cli_main(args) == 0
    assert _documents(prefix) == [tok.tokenize(t) for t in docs[:30]]
    assert cli_main(args + ["--append-eod"]) == 0  # a different option: rebuilt, not up to date
    assert "prepared" in capsys.readouterr().out
    assert _documents(prefix) == [tok.tokenize(t) + [tok.eod] for t in docs[:30]]
    assert load_manifest(prefix.parent)["datasets"]["e_text_document"]["append_eod"] is True


def test_merge_runs_megatrons_gc_collect_over_a_frozen_heap(env, tmp_path, monkeypatch):
    """megatron-core 0.19.2's `IndexedDatasetBuilder.add_index` calls `gc.collect()` once per
    part; over a heap that holds torch that is ~0.25 s per shard (a minute over C4's 256 training
    shards). The merge freezes the heap first, and unfreezes it afterwards."""
    import gc

    from llama31_405b.data import unit as unit_mod
    monkeypatch.setattr(unit_mod, "GROUP_BYTES", 0)  # a part per shard, as with C4's shards
    _, docs, tok_path = env
    shards = _shards(tmp_path / "raw", docs, n=4)
    seen: list[int] = []
    before = gc.get_freeze_count()  # CPython 3.12 starts with a few hundred frozen objects
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: (seen.append(gc.get_freeze_count()),
                                                   collect(*a))[1])
    out = Output(prefix=tmp_path / "ds" / "train_text_document", inputs=tuple(shards))
    [res] = prepare([out], tok_path, data_dir=tmp_path / "ds", workers=1, progress=False)
    assert res.documents == len(docs) and len(seen) == 4
    assert all(n > before + 1000 for n in seen), (before, seen)  # else: the whole heap
    assert gc.get_freeze_count() <= before


@pytest.mark.parametrize("dtype,top", [(np.uint16, 32000), (np.int32, 128256)])
def test_batched_documents_are_written_as_megatrons_builder_writes_them(tmp_path, dtype, top):
    """_add_documents (one write per batch) against IndexedDatasetBuilder.add_document (one per
    document): the same .bin and .idx bytes, for both token dtypes, with empty batches."""
    import itertools

    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from llama31_405b.data.unit import _add_documents
    rng = np.random.default_rng(0)
    batches = [[], [rng.integers(0, top, int(n)).tolist() for n in rng.integers(1, 300, 7)], [],
               [rng.integers(0, top, int(n)).tolist() for n in rng.integers(1, 300, 5)]]
    ours = IndexedDatasetBuilder(str(tmp_path / "a.bin"), dtype=dtype)
    for batch in batches:
        _add_documents(ours, np.fromiter(itertools.chain.from_iterable(batch), dtype=dtype,
                                         count=sum(map(len, batch))), [len(d) for d in batch])
    ours.finalize(str(tmp_path / "a.idx"))
    theirs = IndexedDatasetBuilder(str(tmp_path / "b.bin"), dtype=dtype)
    for doc in itertools.chain.from_iterable(batches):
        theirs.add_document(np.array(doc, dtype=dtype), [len(doc)])
    theirs.finalize(str(tmp_path / "b.idx"))
    for ext in ("bin", "idx"):
        assert (tmp_path / f"a.{ext}").read_bytes() == (tmp_path / f"b.{ext}").read_bytes()


def test_read_ahead_counts_blocks_not_items(env, tmp_path, monkeypatch):
    """Shards of one block each: when a block's result is written, 3 x workers blocks and about
    3 x workers x BLOCK_BYTES are still in flight behind it (the workers never wait for the main
    process to read the next shard), and never much more (memory); the small shards' blocks go
    to the workers several to a task of about BLOCK_BYTES. The window once counted items (a
    block, a shard's end, a unit's end): one block in flight per worker, one task per shard."""
    from llama31_405b.data import unit as unit_mod
    _, docs, tok_path = env
    shards = _shards(tmp_path / "raw", docs, n=48)  # 5 documents, ~11 KB of text each
    block = 1 << 16
    monkeypatch.setattr(unit_mod, "BLOCK_BYTES", block)
    sizes: list[int] = []  # of the blocks, as sent
    tasks: list[int] = []  # blocks of each task
    seen: list[tuple] = []  # (blocks, bytes sent and not written, blocks sent) at each write
    tokenize = unit_mod.tokenize_blocks
    add = unit_mod.PartWriter.add

    def counting_tokenize(tokenizer, blocks):
        sizes.extend(len(b[0]) for b in blocks)
        tasks.append(len(blocks))
        return tokenize(tokenizer, blocks)

    def counting_add(self, *args):
        done = len(seen)
        seen.append((len(sizes) - done, sum(sizes[done:]), len(sizes)))
        return add(self, *args)

    monkeypatch.setattr(prep_mod, "tokenize_blocks", counting_tokenize)
    monkeypatch.setattr(unit_mod.PartWriter, "add", counting_add)
    out = Output(prefix=tmp_path / "ds" / "r_text_document", inputs=tuple(shards))
    [res] = prepare([out], tok_path, data_dir=tmp_path / "ds", workers=1, progress=False)
    assert res.documents == len(docs) and len(sizes) == len(shards) == len(seen)
    assert max(sizes) < block  # one block per shard
    assert len(tasks) < len(shards) // 2 and max(tasks) > 1
    window = 3 * 1  # blocks not yet sent: under one task's worth
    # while reading goes on: the blocks after those sent hold a task's worth, so were not all read
    reading = [(n, b) for n, b, sent in seen if sum(sizes[sent:]) >= block]
    assert len(reading) > len(shards) // 3
    assert all(n >= window and b >= (window - 1) * block for n, b in reading), (seen, tasks)
    assert all(b < window * block + max(sizes) for _, b, _ in seen), seen
