"""The .idx arrays a training read needs come from one read-only copy per node in shared memory
(issue 44: every rank copied the whole .idx, 7.3 GB per 4-GPU node; data/index_share.py):
made by one process of the node, mapped by the others, unlinked once every process mapped it,
equal to megatron-core's arrays; megatron-core's map of the .idx is closed, and a .bin or .idx
changed under the reads ends them with a DataError naming it. The rehearsal reports what the .idx
files cost at init per node (read volume and host memory)."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from llama31_405b.config import load_config
from llama31_405b.data import DataError, binfile, index_share
from llama31_405b.data.binfile import FileStamp
from llama31_405b.data.datasets import make_bin_reads_checked

REPO = Path(__file__).resolve().parents[1]
C2048 = REPO / "configs" / "config_GB200_2048x4x8xtp4pp8cp2.toml"


def _write(prefix: Path, n: int, seed: int = 0) -> Path:
    """An indexed dataset of `n` documents written by megatron-core's own builder."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    rng = np.random.default_rng(seed)
    b = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for _ in range(n):
        b.add_item(torch.from_numpy(rng.integers(0, 500, int(rng.integers(1, 40)))
                                    .astype(np.int64)))
        b.end_document()
    b.finalize(f"{prefix}.idx")
    return prefix


def _dataset(prefix: Path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    return IndexedDataset(str(prefix), mmap=False)


def _ours(token_of: str) -> list[str]:
    return [n for n in os.listdir(index_share.SHM_DIR) if n.startswith(token_of)]


def test_one_process_maps_a_read_only_shared_copy_and_megatrons_map_is_closed(tmp_path):
    prefix = _write(tmp_path / "a", 301)
    ix, eager = _dataset(prefix), _dataset(prefix)
    [s] = make_bin_reads_checked(ix)
    assert s.created and s.ino and s.mapping is not None         # a file of its own, mapped
    assert not os.path.exists(s.path)                          # and unlinked: no name left
    assert _ours(os.path.basename(s.path).rsplit("-", 1)[0]) == []
    for name in ("sequence_lengths", "sequence_pointers"):
        mine, theirs = getattr(ix.index, name), getattr(eager.index, name)
        assert np.array_equal(mine, theirs) and mine.dtype == theirs.dtype
        assert not mine.flags.writeable
    assert ix.index.document_indices is None and not hasattr(ix.index, "bin_buffer_mmap")
    assert all(np.array_equal(ix.get(i), eager.get(i)) for i in range(len(ix)))


def test_a_bin_or_idx_changed_under_the_reads_is_a_data_error_naming_it(tmp_path):
    """Before: the .idx arrays were private copies and the .idx's stat unchecked: a shrunk .idx
    went unnoticed. Now both files are checked; neither is read through a map (no SIGBUS)."""
    a, b = _write(tmp_path / "a", 50), _write(tmp_path / "b", 50, seed=1)
    ia, ib = _dataset(a), _dataset(b)
    make_bin_reads_checked(ia), make_bin_reads_checked(ib)
    ia.get(0), ib.get(0)
    for path in (f"{a}.idx", f"{b}.bin"):
        with open(path, "r+b") as f:
            f.truncate(64)
    time.sleep(binfile.CHECK_INTERVAL_S)
    with pytest.raises(DataError, match=r"a\.idx: changed under the running job \(size \d+ -> "
                                        r"64 bytes"):
        ia.get(len(ia) - 1)
    with pytest.raises(DataError, match=r"b\.bin: .*(shrank|changed under the running job)"):
        ib.get(len(ib) - 1)


def test_an_idx_changed_since_the_build_is_refused_before_the_copy(tmp_path):
    prefix = _write(tmp_path / "a", 20)
    stamps = {f"{prefix}.idx": FileStamp.of(f"{prefix}.idx")}
    ix = _dataset(prefix)
    os.utime(f"{prefix}.idx", ns=(0, 10**9))
    with pytest.raises(DataError, match=r"a\.idx: changed under the running job \(modified"):
        make_bin_reads_checked(ix, stamps)


def test_without_shared_memory_each_process_reads_a_private_copy(tmp_path):
    prefix = _write(tmp_path / "a", 40)
    ix, eager = _dataset(prefix), _dataset(prefix)
    [s] = index_share.share([ix], {}, shm_dir=str(tmp_path / "no-shm"))
    assert s.path is None and s.mapping is None and s.ino == 0
    assert np.array_equal(ix.index.sequence_pointers, eager.index.sequence_pointers)
    assert np.array_equal(ix.index.sequence_lengths, eager.index.sequence_lengths)


def test_a_waiter_names_a_failed_copy_and_a_file_the_job_did_not_make(tmp_path):
    prefix = _write(tmp_path / "a", 10)
    stamp = FileStamp.of(f"{prefix}.idx")
    name = index_share.shared_name(str(tmp_path), "t0", f"{prefix}.idx", stamp)
    with pytest.raises(DataError, match="by another process of this job on this node failed"):
        index_share._wait(name, f"{prefix}.idx")
    Path(name).write_bytes(b"\0" * index_share.copy_bytes(10))   # writable: not the job's copy
    with pytest.raises(DataError, match=r"not the read-only .*copy of .*a\.idx"):
        index_share._map(name, f"{prefix}.idx", stamp, 10, False)


def test_a_second_copier_keeps_the_first_copy_and_is_not_its_maker(tmp_path):
    """Two processes of a node can both copy: the second finds no NAME before the first links it
    and opens NAME.part after the first removed it. Its link then finds NAME: it keeps the first
    copy, removes its own .part and is not the maker (`created` False: the two-process test saw
    both report True once in four runs); only the maker unlinks NAME at release, and an unlink
    that finds it gone is tolerated."""
    prefix = _write(tmp_path / "a", 30)
    idx, ix = f"{prefix}.idx", _dataset(prefix)
    n, d = ix.index.sequence_count, ix.index.document_count
    stamp = FileStamp.of(idx)
    name = index_share.shared_name(str(tmp_path), "t1", idx, stamp)

    def copy() -> bool:
        fd = os.open(name + ".part", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        return index_share._create(name, fd, idx, stamp, n, d, False)

    assert copy() is True
    first = os.stat(name).st_ino
    assert copy() is False                   # the second process's link finds NAME
    assert os.stat(name).st_ino == first and not os.path.exists(name + ".part")
    m, ino = index_share._map(name, idx, stamp, n, False)
    maker = index_share.SharedIndex(idx, name, True, m, ino)
    other = index_share.SharedIndex(idx, name, False, m, ino)
    index_share.release([other])             # not the maker: NAME stays
    assert os.path.exists(name)
    index_share.release([maker, maker])      # the maker unlinks; a second unlink finds it gone
    assert not os.path.exists(name)
    m.close()


def test_rehearsal_reports_the_idx_read_volume_and_host_memory_per_node():
    """The 2,048-node GB200 config: C4 en_6/en_7 at 45,608,611 documents each (the rehearsal's
    C4 size, rehearse/dataset.py), 4 ranks per node. Before: each rank copied both whole .idx
    files (20 bytes per document: 0.9 GB per file), 7.3 GB per node, 3.7 TB read by the job;
    now one 12-byte-per-document copy per node."""
    from llama31_405b.rehearse import dataset, report
    cfg = load_config(C2048)
    plan, _ = dataset.plan(cfg)
    f = plan.idx_share
    docs = 45_608_611
    assert f["ranks_per_node"] == 4 and f["nodes"] == 2048
    assert f["read_bytes"] == f["memory_bytes"] == 2 * (64 + 12 * docs)
    assert f["read_before_bytes"] == 2 * (34 + 12 * docs + 8 * (docs + 1))
    assert f["memory_before_bytes"] == 4 * (f["read_before_bytes"] - 2 * 34)
    assert round(f["memory_before_bytes"] / 1e9, 1) == 7.3
    assert round(f["job_read_before_bytes"] / 1e12, 1) == 3.7
    assert f["job_read_bytes"] == 2048 * f["read_bytes"]
    line = report.format_idx_share(f)
    assert ".idx at init, per node of 4 ranks: 1.09 GB read from the data file system, 1.09 GB " \
           "of host memory" in line and "7.30 GB held" in line and "2.24 TB read" in line
    rep = {"config": "c", "world_size": 8192, "layout": "x", "allocation": "a", "ranks": [],
           "wall_s": 1, "dataset": {**json.loads(json.dumps(plan.as_dict())), "ok": True},
           "steps": 1, "gbs": 1, "max_index_bytes": 1e10, "header": [], "ok": True,
           "precheck": {"ok": True}, "planner_check": [], "capacity_bytes": 1}
    assert line in report.format_text(rep).splitlines()


@pytest.mark.slow
def test_two_processes_of_a_node_share_one_copy_equal_to_megatrons(tiny_env, tmp_path):
    """Two gloo ranks of one node build the tiny training blend: each .idx is copied by one of
    them, both map the same file (inode), which is gone once both mapped; the arrays and reads
    equal megatron-core's own reader; a .bin and an .idx shrunk under the reads are DataErrors
    naming them in both ranks."""
    from helpers import zygote
    data = tmp_path / "data"
    shutil.copytree(tiny_env["data_dir"], data, ignore=shutil.ignore_patterns("index_cache"))
    out = tmp_path / "out"
    out.mkdir()
    zygote.spawn(f"{REPO / 'tests' / 'helpers' / 'index_share_worker.py'}:main",
                 (str(tiny_env["config"]), str(data), str(out)), 2, timeout=600, check=True)
    recs = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    by_idx: dict = {}
    for rec in recs:
        for s in rec["shared"]:
            by_idx.setdefault(s["idx"], []).append(s)
        assert rec["present_after"] == [] and len(rec["present_before"]) == 2
        assert all(rec["equal"]) and all(rec["read_only"]) and all(rec["source_map_closed"])
        assert rec["samples"] == [load_config(tiny_env["config"]).model.seq_length] * 4
        assert "c4-train.en_7_text_document.bin: " in rec["bin_error"]
        assert "c4-train.en_6_text_document.idx: changed under the running job" in \
            rec["idx_error"]
    assert sorted(by_idx) == ["c4-train.en_6_text_document.idx",
                              "c4-train.en_7_text_document.idx"]
    for idx, pair in by_idx.items():
        assert len(pair) == 2 and sum(s["created"] for s in pair) == 1, (idx, pair)  # one copy
        assert pair[0]["ino"] == pair[1]["ino"] != 0 and pair[0]["name"] == pair[1]["name"]
