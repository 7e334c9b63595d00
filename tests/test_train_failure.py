"""A failed run ends with run_stop status aborted in the MLPerf log and a non-zero exit within
60 s: NaN loss, SIGTERM (Slurm walltime / scancel), a killed rank."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, py_env

pytestmark = pytest.mark.slow
LONG = '\n[run]\ndivision = "open"\nmax_steps = 100000\n\n[eval]\ntarget = 0.5\n'


def _events(log: Path) -> list[dict]:
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        if ":::MLLOG " in line:
            out.append(json.loads(line.split(":::MLLOG ", 1)[1]))
    return out


def _run_stop_status(log: Path):
    stops = [e for e in _events(log) if e["key"] == "run_stop"]
    assert len(stops) == 1, f"expected one run_stop in {log}"
    return stops[0]["metadata"]["status"]


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
    stop = [e for e in _events(log) if e["key"] == "run_stop"][0]
    assert "non-finite" in stop["metadata"]["reason"] and stop["metadata"]["step"] == 3
    assert time.monotonic() - t0 < 300


def test_sigterm_aborts_within_60s(tiny_env, tmp_path):
    log = tmp_path / "result.txt"
    p = subprocess.Popen([sys.executable, "-m", "llama31_405b", "train", "--config",
                          str(_long_config(tiny_env, tmp_path)), "--seed", "3", "--log", str(log)],
                         cwd=REPO, env=py_env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: any(e["key"] == "run_start" for e in _events(log)), 240, p)
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
                          f"--master_port={_free_port()}", "--master_addr=127.0.0.1",
                          "-m", "llama31_405b", "train", "--config", str(cfg), "--seed", "4",
                          "--mlperf-log", str(log), "--timeout-s", "30"],
                         cwd=REPO, env=py_env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: any(e["key"] == "run_start" for e in _events(log)), 300, p)
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
