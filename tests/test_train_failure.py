"""A failed run ends with run_stop status aborted in the MLPerf log and a non-zero exit within
60 s: NaN loss, SIGTERM (Slurm walltime / scancel), a killed rank; a signal is logged at once
even while the main thread is blocked in a collective, a stop reaches every rank at the same
step, and a log on a full filesystem stops the run with one error line."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, py_env
from helpers.ports import free_port
from llama31_405b.mlperf.log import log_events, parse_line

pytestmark = pytest.mark.slow
LONG = '\n[run]\ndivision = "open"\nmax_steps = 100000\n\n[eval]\ntarget = 0.5\n'


_events = log_events          # the well-formed events so far ([] before the file exists)


def _run_stop(log: Path):
    """The one run_stop of the log, which must be its last event."""
    ev = _events(log)
    stops = [e for e in ev if e.key == "run_stop"]
    assert len(stops) == 1, f"expected one run_stop in {log}"
    assert ev[-1].key == "run_stop", f"{log} does not end with run_stop: {ev[-1]}"
    return stops[0]


def _run_stop_status(log: Path):
    return _run_stop(log).metadata["status"]


def _wait_for(pred, timeout: float, proc=None) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited early: {proc.returncode}")
        time.sleep(0.5)
    raise AssertionError("timed out")


def _long_config(tiny_env, tmp_path, extra="") -> Path:
    cfg = tmp_path / "long.toml"
    cfg.write_text(f'base = "{tiny_env["config"]}"\n{LONG}{extra}')
    return cfg


NAN_SCRIPT = r"""
import sys, torch
from llama31_405b.cli.train_cmd import train
from llama31_405b.config import load_config
from llama31_405b.train.hooks import Hook
class Poison(Hook):
    def on_step_end(self, run, stats):
        if stats.step == 2:
            with torch.no_grad():
                next(run.model[0].parameters()).fill_(float("nan"))
cfg = load_config(sys.argv[1])
sys.exit(train(cfg, seed=5, log_file=sys.argv[2], extra_hooks=[Poison()]))
"""


def test_nan_loss_aborts(tiny_env, tmp_path):
    script, log = tmp_path / "nan.py", tmp_path / "result.txt"
    script.write_text(NAN_SCRIPT)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(script), str(_long_config(tiny_env, tmp_path)), str(log)],
                       cwd=REPO, env=py_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert _run_stop_status(log) == "aborted"
    stop = _run_stop(log)
    assert "non-finite" in stop.metadata["reason"] and stop.metadata["step"] == 3
    assert time.monotonic() - t0 < 300


def test_sigterm_aborts_within_60s(tiny_env, tmp_path):
    """... and the console's summary reports the log's run_stop: step, samples, minutes."""
    from test_stop_agreement import SUMMARY
    log = tmp_path / "result.txt"
    console = (tmp_path / "stderr.txt").open("w")
    p = subprocess.Popen([sys.executable, "-m", "llama31_405b", "train", "--config",
                          str(_long_config(tiny_env, tmp_path)), "--seed", "3", "--log", str(log)],
                         cwd=REPO, env=py_env(), stdout=subprocess.DEVNULL, stderr=console)
    try:
        _wait_for(lambda: any(e.key == "run_start" for e in _events(log)), 240, p)
        time.sleep(2)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
        assert time.monotonic() - t0 < 60
    finally:
        if p.poll() is None:
            p.kill()
    assert rc != 0
    assert _run_stop_status(log) == "aborted"
    console.close()
    stop, start = _run_stop(log), next(e for e in _events(log) if e.key == "run_start")
    m = SUMMARY.search((tmp_path / "stderr.txt").read_text().strip().splitlines()[-1])
    assert m and m.group(1, 2, 3) == ("aborted", str(stop.metadata["step"]),
                                      str(stop.metadata["samples_count"]))
    assert m.group(4) == f"{(stop.time_ms - start.time_ms) / 6e4:.3f}"


def _rank_pids(parent_pid: int) -> dict[int, int]:
    import psutil
    out = {}
    for child in psutil.Process(parent_pid).children(recursive=True):
        try:
            env = child.environ()
        except (psutil.Error, OSError):
            continue
        if "RANK" in env and "llama31_405b" in " ".join(child.cmdline()):
            out[int(env["RANK"])] = child.pid
    return out


def test_killed_rank_aborts_within_60s(tiny_env, tmp_path):
    log = tmp_path / "result.txt"
    cfg = _long_config(tiny_env, tmp_path,
                       '\n[system]\ngpus_per_rack = 2\n\n[batch]\nminibs = 4\n')
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          f"--master_port={free_port()}", "--master_addr=127.0.0.1",
                          "-m", "llama31_405b", "train", "--config", str(cfg), "--seed", "4",
                          "--mlperf-log", str(log), "--timeout-s", "30"],
                         cwd=REPO, env=py_env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: any(e.key == "run_start" for e in _events(log)), 300, p)
        time.sleep(2)
        pids = _rank_pids(p.pid)
        assert 1 in pids, pids
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        rc = p.wait(timeout=60)
        assert time.monotonic() - t0 < 60
    finally:
        if p.poll() is None:
            p.kill()
    assert rc != 0
    assert _run_stop_status(log) == "aborted"
    # the reason names the lost rank: the failed collective's or the launcher's SIGTERM's
    assert _run_stop(log).metadata["reason"].startswith("rank 1 lost (its process ended)"), (
        _run_stop(log))


TWO_RANKS = '\n[system]\ngpus_per_rack = 2\n\n[batch]\nminibs = 4\n'      # DP 2 on 2 processes


def _no_rank_failed(err: str) -> None:
    """No rank ended on an exception (the loop prints its traceback; a dead peer shows as gloo's
    "Connection closed"). torchrun's own ChildFailedError report of the exit codes is fine."""
    assert "Connection closed" not in err and "llama31_405b/train/loop.py" not in err, err[-4000:]


def _torchrun(cfg: Path, log: Path, seed: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                             f"--master_port={free_port()}", "--master_addr=127.0.0.1",
                             "-m", "llama31_405b", "train", "--config", str(cfg), "--seed",
                             str(seed), "--mlperf-log", str(log), "--timeout-s", "300"],
                            cwd=REPO, env=py_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def test_signal_is_logged_at_once_while_blocked_in_a_collective(tiny_env, tmp_path):
    """Rank 1 frozen (SIGSTOP): rank 0's main thread waits inside gloo's all-reduce, in C++,
    where no Python signal handler runs. Its SIGTERM must still put run_stop in the log at once
    (the watchdog thread); once rank 1 resumes, both stop together at the end of that step."""
    log = tmp_path / "result.txt"
    p = _torchrun(_long_config(tiny_env, tmp_path, TWO_RANKS), log, seed=6)
    try:
        _wait_for(lambda: any(e.key == "tracked_stats" for e in _events(log)), 300, p)
        pids = _rank_pids(p.pid)
        os.kill(pids[1], signal.SIGSTOP)
        time.sleep(3)                        # rank 0 reaches the step's collectives and waits
        before = len(_events(log))
        os.kill(pids[0], signal.SIGTERM)
        _wait_for(lambda: any(e.key == "run_stop" for e in _events(log)), 10)
        assert len(_events(log)) == before + 1      # nothing else: the main thread is still stuck
        os.kill(pids[1], signal.SIGCONT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0
    stop = _run_stop(log)
    assert (stop.metadata["status"], stop.metadata["reason"]) == ("aborted", "received SIGTERM")
    _no_rank_failed(err)                             # a clean stop of both ranks, no dead peer


def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step(tiny_env, tmp_path):
    """SIGTERM to rank 1 only: its stop request rides in the next step's loss all-reduce, so
    rank 0 stops at the same step instead of waiting in a collective for a rank that left."""
    log = tmp_path / "result.txt"
    p = _torchrun(_long_config(tiny_env, tmp_path, TWO_RANKS), log, seed=7)
    try:
        _wait_for(lambda: any(e.key == "tracked_stats" for e in _events(log)), 300, p)
        os.kill(_rank_pids(p.pid)[1], signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0
    stop = _run_stop(log)
    assert stop.metadata["status"] == "aborted"
    # (torchrun may SIGTERM rank 0 too once rank 1 has exited: either way, no dead-peer error)
    assert stop.metadata["reason"].startswith(("stopped with the other ranks", "received SIGTERM"))
    _no_rank_failed(err)


FULL_DISK = r"""
set -u
mount -t tmpfs -o size=16k tmpfs "$MNT" || exit 99
"$PY" -m llama31_405b train --config "$CFG" --seed 8 --log "$MNT/result.txt" > "$OUT/stdout.txt" 2> "$OUT/stderr.txt"
rc=$?
cp "$MNT/result.txt" "$OUT/result.txt"
exit $rc
"""


def test_full_filesystem_stops_the_run_with_one_error(tiny_env, tmp_path):
    """The log on a 16 KB tmpfs (mounted in a private mount namespace): the run stops within one
    step of the first failed write, exits non-zero, prints one error line naming the path, and
    no run_stop success appears anywhere."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = tmp_path / "full_disk.sh"
    script.write_text(FULL_DISK)
    ns = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        ns[1:1] = ["--user", "--map-root-user"]
    env = py_env() | {"MNT": str(mnt), "PY": sys.executable, "OUT": str(tmp_path),
                      "CFG": str(tiny_env["config"])}
    try:
        r = subprocess.run([*ns, "sh", str(script)], cwd=REPO, env=env, timeout=600)
    except FileNotFoundError:
        pytest.skip("unshare(1) is not installed")
    if r.returncode == 99 or (r.returncode != 0 and not (tmp_path / "stderr.txt").exists()):
        pytest.skip("cannot mount a tmpfs in a private mount namespace here")
    path = f"{mnt}/result.txt"
    assert r.returncode != 0
    err = (tmp_path / "stderr.txt").read_text()
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: cannot write the MLPerf log {path}: No space left on device "
                      "(ENOSPC); stopping the run"], err[-3000:]
    assert "Traceback" not in err
    in_file = log_events(tmp_path / "result.txt")
    copy = [e for i, ln in enumerate((tmp_path / "stdout.txt").read_text().splitlines())
            if (e := parse_line(ln, "stdout", i)) is not None]
    assert not any(e.key == "run_stop" and e.metadata.get("status") == "success"
                   for e in in_file + copy)
    last_written = max(e.metadata["step"] for e in in_file if e.key == "tracked_stats")
    stop = copy[-1]                   # the copy on stdout still ends with run_stop aborted
    assert stop.key == "run_stop" and stop.metadata["status"] == "aborted"
    assert path in stop.metadata["reason"]
    # the write of step last_written + 1 failed: the run ends after that step or the next
    assert stop.metadata["step"] <= last_written + 2

