"""What a new user's bad inputs found (issue 45 item 10): each says what is wrong, by name.

- `launch check-log --config <405b config>` on a log labelled llama31_8b says the log's benchmark
  differs from the config's, and prints no "converged" beside the failed rules;
- `compliance check` does not print the 8b accuracy failure and "converged: ... <= 5.6" in one
  line;
- `check-log` on a file the reader refused (two runs) prints no run_stop status;
- `launch env --runs 0` and `NEXP=0 run_and_time.sh` name the option and the variable;
- `run_and_time.sh` run locally with CLEAR_CACHES=auto leaves the machine's page cache alone."""
from __future__ import annotations

import subprocess
import sys

import pytest
from mlperf_logs import LOGS, need_fixture, set_value

from conftest import REPO, py_env
from llama31_405b.cli import main

H200 = "configs/config_H200_64x8x120xtp4pp8cp2.toml"


@pytest.fixture
def log_8b(tmp_path):
    need_fixture()
    log = tmp_path / "result_0.txt"
    log.write_bytes(LOGS[0].read_bytes())
    set_value(log, "submission_benchmark", "llama31_8b")
    return log


def test_check_log_names_another_benchmarks_log(log_8b, capsys):
    assert main(["launch", "check-log", "--config", H200, str(log_8b)]) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith(
        f"FAIL {log_8b}: NOT compliant, run_stop status success -- {log_8b}:258: "
        "submission_benchmark 'llama31_8b', but the config says run.benchmark = 'llama31_405b': "
        "the log of another benchmark's run"), line
    assert "converged" not in line


def test_compliance_check_prints_no_convergence_beside_a_failed_rule(log_8b, capsys):
    assert main(["compliance", "check", str(log_8b)]) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert "closed_llama31_8b.yaml" in first
    assert first.endswith("; not counted as converged: the log fails the rules above"), first
    assert "<= 5.6" not in first


def test_check_log_of_a_refused_file_prints_no_run_stop_status(tmp_path, capsys):
    need_fixture()
    two = tmp_path / "two.txt"
    two.write_bytes(LOGS[0].read_bytes() + LOGS[1].read_bytes())
    assert main(["launch", "check-log", "--config", H200, "--report-dir", str(tmp_path / "rep"),
                 str(two)]) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"FAIL {two}: NOT compliant, not one run's log (the reader refused "
                           f"it) -- {two}:"), line
    assert "run_stop status" not in line and "a second run_start" in line
    kept = (tmp_path / "rep" / "two.compliance.log").read_text()
    assert kept.splitlines()[-1] == "outcome: not read: the reader refused the file"


def test_runs_0_names_the_option(capsys):
    with pytest.raises(SystemExit) as e:
        main(["launch", "env", "configs/tiny_cpu.toml", "--runs", "0"])
    assert e.value.code == 2
    assert "argument --runs: 0: the number of runs must be >= 1" in capsys.readouterr().err


def _script(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "run_and_time.sh")], cwd=REPO,
                          env=py_env() | {"CONFIG": "configs/tiny_cpu.toml", "DRY_RUN": "1",
                                          "LOGDIR": str(tmp_path / "logs"),
                                          "PYTHON": sys.executable} | env,
                          capture_output=True, text=True, timeout=300)


def test_nexp_0_names_the_variable(tmp_path):
    r = _script(tmp_path, NEXP="0")
    assert r.returncode == 2
    assert r.stderr.strip() == ("run_and_time.sh: NEXP=0: the number of runs must be a whole "
                                "number >= 1 (unset: run.num_runs)")
    assert not (tmp_path / "logs").exists()


def test_a_local_run_drops_the_page_cache_only_when_asked(tmp_path):
    """DRY_RUN prints each command instead of running it: locally, CLEAR_CACHES=auto (the
    default) prints no drop of the page cache; CLEAR_CACHES=1 does."""
    auto = _script(tmp_path / "a", NEXP="1")
    assert auto.returncode == 0, auto.stderr
    assert "drop_caches" not in auto.stderr and "cache cleared: false" in auto.stderr
    assert "a local run keeps this machine's page cache" in auto.stderr
    asked = _script(tmp_path / "b", NEXP="1", CLEAR_CACHES="1")
    assert asked.returncode == 0, asked.stderr
    assert "drop_caches" in asked.stderr and "cache cleared: dry-run" in asked.stderr
