"""How a finished run is judged and reported: `launch check-log` (the compliance checker
in-process, the run's outcome from its run_stop, the report directory it promises) and the
per-run summary and exit code of run_and_time.sh."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, py_env
from llama31_405b.mlperf.log import log_events
from mlperf_logs import LOGS, need_fixture

GB200 = "configs/config_GB200_2048x4x8xtp4pp8cp2.toml"
FIXTURE = LOGS[0]


def _check_log(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llama31_405b", "launch", "check-log", *args],
                          cwd=REPO, env=py_env(), capture_output=True, text=True, timeout=300)


def test_check_log_verdicts_and_report_dir(tmp_path):
    need_fixture()
    reports = tmp_path / "reports"
    base = ["--config", GB200, "--require-success", "--report-dir", str(reports)]
    ok = _check_log(*base, str(FIXTURE))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.strip() == (f"PASS {FIXTURE}: compliant, run_stop status success, converged: "
                                 "5.56899 <= 5.6, 235.864 min, 288,000 samples")
    kept = (reports / f"{FIXTURE.stem}.compliance.log").read_text()
    assert kept.startswith(f"PASS {FIXTURE} (ruleset 6.0.0: training_6.0.0/common.yaml, ")
    assert "training_6.0.0/closed_llama31_405b.yaml" in kept and "outcome: success" in kept

    text = FIXTURE.read_text()
    aborted = tmp_path / "aborted.txt"
    aborted.write_text(text.replace('"status": "success"',
                                    '"status": "aborted", "reason": "received SIGTERM"'))
    bad = _check_log(*base, str(aborted))
    assert bad.returncode == 1
    assert bad.stdout.strip() == (f"FAIL {aborted}: compliant, run_stop status aborted "
                                  "(received SIGTERM)")
    assert "outcome: aborted (received SIGTERM)" in (reports / "aborted.compliance.log").read_text()

    cut = tmp_path / "cut.txt"             # a run killed before run_stop
    cut.write_text("".join(text.splitlines(keepends=True)[:300]))
    missing = tmp_path / "none.txt"
    bad = _check_log(*base, str(aborted), str(cut), str(missing))
    assert bad.returncode == 4             # no run_stop beats a failed run
    lines = bad.stdout.splitlines()
    assert lines[1].startswith(f"FAIL {cut}: NOT compliant, run_stop status missing -- ")
    assert "run_stop" in lines[1].split(" -- ", 1)[1]       # the checker's own words
    assert lines[2] == (f"FAIL {missing}: NOT compliant, run_stop status missing -- log file "
                        "missing: the run wrote no MLPerf log")
    cut_report = (reports / "cut.compliance.log").read_text()
    assert cut_report.startswith(f"FAIL {cut}") and "problems:" in cut_report
    assert "outcome: no run_stop" in cut_report
    assert "log file missing" in (reports / "none.compliance.log").read_text()


def test_launch_does_not_import_the_cli():
    code = ("import sys, llama31_405b.launch.logcheck, llama31_405b.launch; "
            "print(sorted(m for m in sys.modules if m.startswith('llama31_405b.cli')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=py_env(),
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _train_pid(script_pid: int, log: Path) -> int | None:
    import psutil
    for child in psutil.Process(script_pid).children(recursive=True):
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if "train" in cmd and str(log) in cmd:
            return child.pid
    return None


def _wait_for(pred, timeout: float, what: str):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.stress    # run_and_time.sh runs killed on purpose, 1-2 min: `make test-stress`
def test_run_and_time_reports_each_runs_outcome(tiny_env, tmp_path):
    """Two local runs (no Slurm): the first gets SIGTERM (aborted, with the signal as reason),
    the second SIGKILL (no run_stop). The summary names both outcomes; exit 4 (a killed run)."""
    cfg = tmp_path / "slow.toml"
    cfg.write_text(f'base = "{tiny_env["config"]}"\n\n[testing]\nstep_delay_s = 2.0\n')
    logs = tmp_path / "logs"
    env = py_env() | {"CONFIG": str(cfg), "NEXP": "2", "LOGDIR": str(logs), "CLEAR_CACHES": "0",
                      "PYTHON": sys.executable}
    p = subprocess.Popen(["bash", str(REPO / "run_and_time.sh")], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for i, sig in enumerate((signal.SIGTERM, signal.SIGKILL)):
            log = logs / f"result_{i}.txt"
            _wait_for(lambda: any(e.key == "block_start" for e in log_events(log)), 300,
                      f"block_start in {log}")
            os.kill(_wait_for(lambda: _train_pid(p.pid, log), 30, "the train process"), sig)
        out, _ = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 4, out
    assert (f"run 0 seed 1: train exit 1; FAIL {logs}/result_0.txt: NOT compliant, run_stop "
            "status aborted (received SIGTERM)") in out
    assert (f"run 1 seed 2: train exit 137; FAIL {logs}/result_1.txt: NOT compliant, "
            "run_stop status missing") in out
    assert "1 run(s) aborted or not compliant, 1 run(s) without run_stop (killed)" in out


def _rank_pid(script_pid: int, rank: int) -> int | None:
    import psutil
    for child in psutil.Process(script_pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "train" in child.cmdline():
                return child.pid
        except psutil.Error:
            continue
    return None


@pytest.mark.slow
@pytest.mark.stress    # run_and_time.sh runs killed on purpose, 1-2 min: `make test-stress`
def test_run_and_time_names_the_rank_torchrun_saw_killed(tiny_env, tmp_path):
    """Two ranks under torchrun (no Slurm), SIGKILL to rank 1: the outcome line adds torchrun's
    report (which rank, which signal), and the console is kept beside the log."""
    cfg = tmp_path / "two.toml"
    cfg.write_text(f'base = "{tiny_env["config"]}"\n\n[system]\ngpus_per_rack = 2\n\n[batch]\n'
                   "minibs = 4\n\n[testing]\nstep_delay_s = 1.0\n")
    logs = tmp_path / "logs"
    env = py_env() | {"CONFIG": str(cfg), "NEXP": "1", "LOGDIR": str(logs), "CLEAR_CACHES": "0",
                      "PYTHON": sys.executable}
    p = subprocess.Popen(["bash", str(REPO / "run_and_time.sh")], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log = logs / "result_0.txt"
        _wait_for(lambda: any(e.key == "block_start" for e in log_events(log)), 300,
                  f"block_start in {log}")
        pid = _wait_for(lambda: _rank_pid(p.pid, 1), 30, "rank 1")
        os.kill(pid, signal.SIGKILL)
        out, _ = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0, out
    line = next(ln for ln in out.splitlines() if "run 0 seed" in ln)
    assert f"launcher (torchrun): rank 1 (pid {pid}) killed by SIGKILL first" in line, out[-3000:]
    assert (logs / "console_0.txt").is_file()
