"""Data changed under a run (issue 36, part 3): the training loader reads the .bin files with
pread, never a map, and checks their stat, so a file shrunk, replaced or rewritten under a
running loader is a DataError naming it (a mapped file that shrank killed the process with
SIGBUS: no run_stop, no file named); in a training run that becomes run_stop aborted with that
reason. A truncated .bin with data.require_verified = false is refused before run_start, from
its size against the .idx (metadata only)."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from data_helpers import FileAccessWatch
from helpers import zygote
from llama31_405b.data import DataError, binfile
from llama31_405b.data.datasets import build_datasets
from llama31_405b.data.indexed import read_index
from llama31_405b.data.verify import check_metadata, require_verified, verify_data
from llama31_405b.mlperf.log import log_events
from test_data_verify import _cfg, prepared  # noqa: F401  (the module's data fixture)

REPO = Path(__file__).resolve().parents[1]
EN6 = "c4-train.en_6_text_document"
VALID = "c4-validation.en_text_document"


@pytest.fixture
def data(prepared, tmp_path):  # noqa: F811
    """A private, verified copy of the prepared data (tests below change its files)."""
    dst = tmp_path / "data"
    shutil.copytree(prepared, dst, ignore=shutil.ignore_patterns("index_cache"))
    verify_data(_cfg(dst))
    return dst


def _shrink(path: Path, keep: int = 64) -> None:
    """Overwrite in place by a shorter file (same inode), as `cat short > file` does."""
    with open(path, "r+b") as f:
        f.truncate(keep)


def _read_all(train, valid) -> None:
    for i in range(len(train)):
        train[i]
    for i in range(len(valid)):
        valid[i]


def test_file_shrunk_under_the_loader_is_a_data_error_naming_it(data):
    train, valid = build_datasets(_cfg(data), seed=3, train_samples=40)
    with FileAccessWatch() as w:
        train[0], valid[0]
    assert w.touched(".bin") and not [p for p in w.mapped if p.endswith(".bin")]   # never mapped
    _shrink(data / f"{EN6}.bin")
    with pytest.raises(DataError, match=rf"{EN6}\.bin: .*(shrank|changed under the running "
                       r"job \(size \d+ -> 64 bytes)"):
        _read_all(train, valid)
    _shrink(data / f"{VALID}.bin")
    time.sleep(binfile.CHECK_INTERVAL_S)
    with pytest.raises(DataError, match=rf"{VALID}\.bin: changed under the running job \(size"):
        valid[1]


def test_file_replaced_or_rewritten_under_the_loader_is_found_within_the_interval(data):
    train, valid = build_datasets(_cfg(data), seed=3, train_samples=40)
    train[0]
    src = data / f"{EN6}.bin"
    other = data / "other.bin"               # same size, other inode: a copy moved over it
    shutil.copyfile(src, other)
    os.replace(other, src)
    time.sleep(binfile.CHECK_INTERVAL_S)
    with pytest.raises(DataError, match=rf"{EN6}\.bin: changed under the running job \("
                       r"replaced by another file"):
        _read_all(train, valid)
    train, valid = build_datasets(_cfg(data, require_verified=False), seed=3, train_samples=40)
    valid[0]
    st = os.stat(data / f"{VALID}.bin")      # rewritten in place, same size: mtime
    os.utime(data / f"{VALID}.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    time.sleep(binfile.CHECK_INTERVAL_S)
    with pytest.raises(DataError, match=rf"{VALID}\.bin: changed .*modified \(mtime changed\)"):
        valid[1]


def test_a_file_changed_after_its_verification_is_refused_when_the_datasets_are_built(data):
    """The stamps the loader checks against start from the verification's record, not from
    whatever the file is when the run builds its datasets."""
    cfg = _cfg(data)
    verified = require_verified(cfg)["datasets"]
    st = os.stat(data / f"{EN6}.bin")
    os.utime(data / f"{EN6}.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(DataError, match=rf"{EN6}\.bin: changed .* since its verification"):
        build_datasets(cfg, seed=3, train_samples=40, verified=verified)


def test_truncated_bin_is_refused_from_the_index_without_reading_it(data):
    """require_verified = false: the .bin's size against where the .idx says the last sequence
    ends (the header and 12 bytes of the .idx, stat of the .bin): no .bin opened."""
    full = read_index(data / EN6)
    with open(data / f"{EN6}.bin", "r+b") as f:
        f.truncate(full.bin_size - 2 * 7)          # 7 tokens short: a whole number of tokens
    cfg = _cfg(data, require_verified=False)
    with FileAccessWatch() as w, pytest.raises(
            DataError, match=rf"data.train_prefixes\[0\] = {EN6}: .*{EN6}\.bin: "
            rf"{full.bin_size - 14} bytes, but {EN6}\.idx says its last sequence ends at byte "
            rf"{full.bin_size}: the \.bin is truncated"):
        check_metadata(cfg)
    assert not w.touched(".bin")


# -- in a training run -----------------------------------------------------------------------
def _train_config(tmp_path: Path, data_dir: Path, **extra) -> Path:
    """A tiny training config on the small prepared data (sequences of 32, open division so that
    the evaluation schedule can be set), no initial checkpoint."""
    lines = [f'base = "{REPO / "configs" / "tiny_cpu.toml"}"', "", "[model]", "seq_length = 32",
             "", "[data]", f'data_dir = "{data_dir}"', 'tokenizer = "tokenizer/tok.model"',
             'pretrain_prefix = ""', *(f"{k} = {json.dumps(v)}" for k, v in extra.items()),
             "", "[run]", 'division = "open"', "max_steps = 12", "", "[eval]",
             "first_step = 12", "interval_steps = 12"]
    path = tmp_path / "changed.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _shrinking_run(rank: int, config: str, log: str, victim: str, out: str) -> None:
    """Train (the `train` command's function, one process), and at the end of step 2 overwrite
    `victim` in place by a 64-byte file."""
    from llama31_405b.cli.train_cmd import train
    from llama31_405b.config import load_config
    from llama31_405b.train.hooks import Hook

    class Shrink(Hook):
        def on_step_end(self, run, stats):
            if stats.step == 2:
                _shrink(Path(victim))
                Path(out + ".t").write_text(repr(time.monotonic()))

    cfg = load_config(config)
    code = train(cfg, seed=5, log_file=log, init_checkpoint="", extra_hooks=[Shrink()])
    Path(out).write_text(json.dumps({"code": code, "end": time.monotonic()}))


@pytest.mark.slow
def test_training_bin_shrunk_at_step_2_ends_in_run_stop_aborted_naming_it(data, tmp_path):
    """Before: `Bus error` (SIGBUS in the loader thread's read of a vanished page), no run_stop,
    no file named. Now: the run's MLPerf log ends with run_stop aborted, its reason naming the
    file, within seconds of the change; exit status 2 (bad input: data)."""
    config = _train_config(tmp_path, data)
    log, out = tmp_path / "result.txt", tmp_path / "out.json"
    victim = data / f"{EN6}.bin"
    r = zygote.spawn(_shrinking_run, (str(config), str(log), str(victim), str(out)), 1,
                     launcher="single", timeout=600)
    assert r.returncode == 0 and out.is_file(), r.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["code"] == 2
    assert res["end"] - float(Path(f"{out}.t").read_text()) < 30
    events = log_events(log)
    last = events[-1]
    assert any(e.key == "run_start" for e in events)
    assert last.key == "run_stop" and last.metadata["status"] == "aborted", last
    reason = last.metadata["reason"]
    assert str(victim) in reason and ("shrank" in reason
                                      or "changed under the running job" in reason), reason


def _cli(rank: int, argv: list, out: str) -> None:
    """`python -m llama31_405b ARGV` in a fork of the preloaded zygote; the status to `out`."""
    from llama31_405b.cli import main
    Path(out).write_text(str(main(argv)))


@pytest.mark.slow
def test_truncated_bin_without_verification_is_refused_before_run_start(data, tmp_path):
    """require_verified = false and a truncated .bin: before, run_start was logged and step 0
    failed with NumPy's "offset must be non-negative and no greater than buffer length", no
    file named. Now: `train` stops before run_start, exit 2, one error line naming the file."""
    victim = data / f"{EN6}.bin"
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2 // 2 * 2)
    config = _train_config(tmp_path, data, require_verified=False)
    log, out = tmp_path / "result.txt", tmp_path / "status"
    argv = ["train", "--config", str(config), "--seed", "1", "--log", str(log),
            "--init-checkpoint", ""]
    r = zygote.spawn(_cli, (argv, str(out)), 1, launcher="single", timeout=600, check=True)
    err = r.ranks[0].stderr
    assert out.read_text() == "2", err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"{victim}: " in errors[0] and "truncated" in errors[0], err
    events = log_events(log)
    assert not any(e.key == "run_start" for e in events)
    assert events[-1].key == "run_stop" and str(victim) in events[-1].metadata["reason"]
    assert Path(log).read_text().count("\"key\": \"run_stop\"") == 1

def test_data_verify_reads_the_bin_files_without_mapping_them(data):
    """`data verify` reads every token of these small files (ids below the vocab, the EOD
    convention) by pread too: a file shrinking under it is an error naming it, not SIGBUS."""
    with FileAccessWatch() as w:
        verify_data(_cfg(data), full=True)
    assert w.touched(".bin") and not [p for p in w.mapped if p.endswith(".bin")], w.mapped


def test_an_idx_shrunk_under_the_loader_is_a_data_error_naming_it(data):
    """megatron-core keeps the .idx mapped, its arrays views of the map: the loader reads them
    from its node's read-only copy in shared memory (data.index_share) and closes that map, so
    an .idx shrunk under the run is never read (no SIGBUS); the reader's stat check of the .idx
    ends the run with a DataError naming it."""
    train, valid = build_datasets(_cfg(data), seed=3, train_samples=40)
    train[0]
    _shrink(data / f"{EN6}.idx")
    time.sleep(binfile.CHECK_INTERVAL_S)
    with pytest.raises(DataError, match=rf"{EN6}\.idx: changed under the running job \(size "
                                        r"\d+ -> 64 bytes"):
        for i in range(len(train)):
            train[i]
