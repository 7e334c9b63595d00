"""The loops that wait for a file another process writes, taken through every turn on purpose.

Multi-process tests pass through them only when the other process happens to be late, so whether
their sleep ran changed from run to run (a CI run where every profile rank finished before rank 0
looked found `_wait_for_ranks`'s sleep never executed, which the coverage inventory refused).
Here a thread writes the file after the first look, and a file that never comes hits the timeout."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from llama31_405b.cli import profile_cmd
from llama31_405b.data import index_share
from llama31_405b.data.errors import DataError


def _write_later(path: Path, data: bytes = b"{}", after_s: float = 0.3) -> threading.Thread:
    def write():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.rename(path)                     # appears whole, as the writers' files do
    t = threading.Timer(after_s, write)
    t.start()
    return t


def test_rank_0_waits_for_a_rank_file_that_arrives_late(tmp_path):
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank00000.json").write_text("{}")
    t = _write_later(tmp_path / "ranks" / "rank00001.json")
    try:
        assert profile_cmd._wait_for_ranks(tmp_path, 2, timeout_s=30)
    finally:
        t.join()


def test_rank_0_names_the_ranks_whose_file_never_arrives(tmp_path, capsys):
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank00001.json").write_text("{}")
    assert not profile_cmd._wait_for_ranks(tmp_path, 4, timeout_s=0.3)
    err = capsys.readouterr().err
    assert "no file from rank(s) [0, 2, 3] after 0 s" in err and f"{tmp_path}/ranks" in err


def test_a_waiter_takes_the_copy_another_process_finishes_late(tmp_path):
    name = tmp_path / "copy"
    Path(str(name) + ".part").write_bytes(b"")         # another process is copying
    t = _write_later(name, b"\0" * 8)
    try:
        index_share._wait(str(name), "data/a.idx")        # returns once NAME exists
    finally:
        t.join()
    assert name.is_file()


def test_a_waiter_gives_up_on_a_copy_that_never_ends(tmp_path, monkeypatch):
    name = tmp_path / "copy"
    Path(str(name) + ".part").write_bytes(b"")
    monkeypatch.setattr(index_share, "WAIT_S", 0.2)
    with pytest.raises(DataError, match=r"copy of data/a\.idx's read-time arrays by another "
                                        r"process .* was not done in 0 s"):
        index_share._wait(str(name), "data/a.idx")
