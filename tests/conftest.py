"""Shared, expensive fixtures, prepared once per test session (also across xdist workers):

- `tiny_env`: tiny data (ensure_tiny_data) and the tiny initial checkpoint, in a directory shared
  by all workers, plus a config file `tiny.toml` pointing at them;
- `tiny_runs`: MLPerf logs of 3 completed tiny runs with seeds drawn from the system's entropy
  (as `launch env` draws them for a config without run.seed_base), run through the real command
  `python -m llama31_405b train`; the fixture fails, with the run's stderr, if any run exited
  non-zero.

Tests that use either fixture train, so they must be marked `slow`: collection stops with an
error naming any that is not (pytest_collection_modifyitems below). So must tests marked `stress`
(the fault loops repeated to catch flakiness) and `converge` (runs trained to the tiny target);
both run in `make test-stress`, not in `make test`. A test that uses `tiny_runs` or
`tiny_run_seeds` must be marked `converge`, or `make test` would train the three runs.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

# the local Slurm cluster, one session fixture for every Slurm test module (tests/conftest_slurm.py)
from conftest_slurm import slurm_cluster  # noqa: E402,F401
from conftest_schedule import assign_groups, order
# `--cpu-times FILE`: each test's CPU seconds (tests/conftest_cpu_times.py)
from conftest_cpu_times import (pytest_addoption, pytest_runtest_call,  # noqa: F401
                                pytest_runtest_setup, pytest_runtest_teardown)

REPO = Path(__file__).resolve().parents[1]
NUM_TINY_RUNS = 3


def py_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


TRAINING_FIXTURES = ("tiny_env", "tiny_runs", "tiny_run_seeds")
# the fixtures that train to the tiny target: only `converge` tests may use them
CONVERGING_FIXTURES = ("tiny_runs", "tiny_run_seeds")
LONG_MARKERS = ("stress", "converge")


def _using_without_marker(items, fixtures, marker: str) -> list[str]:
    """Node ids of collected tests that use one of `fixtures` but are not marked `marker`."""
    return [it.nodeid for it in items
            if set(fixtures) & set(getattr(it, "fixturenames", ()))
            and it.get_closest_marker(marker) is None]


def unmarked_training_tests(items) -> list[str]:
    """Node ids of collected tests that pull a training fixture but are not marked slow."""
    return _using_without_marker(items, TRAINING_FIXTURES, "slow")


def unmarked_stress_tests(items) -> list[str]:
    """Node ids of collected tests marked `stress` or `converge` but not `slow`."""
    return [it.nodeid for it in items
            if any(it.get_closest_marker(m) is not None for m in LONG_MARKERS)
            and it.get_closest_marker("slow") is None]


def unmarked_converging_tests(items) -> list[str]:
    """Node ids of collected tests that use the tiny runs (or their seeds, to train beside
    them) but are not marked `converge`: `make test` would train the three runs for them."""
    return _using_without_marker(items, CONVERGING_FIXTURES, "converge")


def misplaced_slurm_tests(items) -> list[str]:
    """Node ids of collected tests that use the Slurm cluster without the `slurm` marker or
    without `xdist_group("slurm")` (the one xdist worker that owns the cluster: any other worker
    would wait on the cluster's lock for the whole Slurm suite)."""
    out = []
    for it in items:
        if "slurm_cluster" not in getattr(it, "fixturenames", ()):
            continue
        group = it.get_closest_marker("xdist_group")
        name = (group.args[0] if group.args else group.kwargs.get("name")) if group else None
        if it.get_closest_marker("slurm") is None or name != "slurm":
            out.append(it.nodeid)
    return out


@pytest.hookimpl(tryfirst=True)      # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    bad = unmarked_training_tests(items)
    if bad:
        raise pytest.UsageError("these tests train (tiny_env/tiny_runs) but are not marked "
                                "slow, so `make test-fast` would run them: " + ", ".join(bad))
    bad = unmarked_stress_tests(items)
    if bad:
        raise pytest.UsageError("these tests are marked stress or converge but not slow, so "
                                "`make test-fast` would run them: " + ", ".join(bad))
    bad = unmarked_converging_tests(items)
    if bad:
        raise pytest.UsageError("these tests use tiny_runs or tiny_run_seeds but are not marked "
                                "converge, so `make test` would train the tiny runs: "
                                + ", ".join(bad))
    bad = misplaced_slurm_tests(items)
    if bad:
        raise pytest.UsageError("these tests use slurm_cluster but are not marked both "
                                "`slurm` and `xdist_group(\"slurm\")`: " + ", ".join(bad))
    # which worker runs what, and in which order (tests/conftest_schedule.py)
    assign_groups(items)
    order(items)


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory) -> Path:
    """A directory shared by all xdist workers of this session."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    d = base / "shared"
    d.mkdir(exist_ok=True)
    return d


def write_tiny_config(path: Path, data_dir: Path, ckpt_dir: Path, extra: str = "") -> Path:
    """Write the config atomically (temp file + rename): another xdist worker may be reading the
    same shared file outside the lock, and must never see it empty or half written."""
    text = (f'base = "{REPO / "configs" / "tiny_cpu.toml"}"\n\n'
            f'[data]\ndata_dir = "{data_dir}"\n\n'
            f'[checkpoint]\nckpt_dir = "{ckpt_dir}"\n{extra}')
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


@pytest.fixture(scope="session")
def tiny_env(shared_dir) -> dict:
    """Tiny data + the tiny initial checkpoint, made once; returns paths."""
    root = shared_dir / "tiny"
    data_dir, ckpt_dir = root / "data", root / "ckpt"
    with _locked(shared_dir / "tiny.lock"):
        root.mkdir(exist_ok=True)
        cfg = write_tiny_config(root / "tiny.toml", data_dir, ckpt_dir)
        from llama31_405b.data.tiny import ensure_tiny_data
        ensure_tiny_data(data_dir)
        r = subprocess.run([sys.executable, "-m", "llama31_405b", "train-init", "--config",
                            str(cfg)], cwd=REPO, env=py_env(), capture_output=True, text=True,
                           timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    return {"root": root, "data_dir": data_dir, "ckpt_dir": ckpt_dir, "config": cfg}


# niceness of the tiny runs (no test times them; three processes, so they use both cores once the
# rest is done): they soak up the CPU the other tests leave idle, and the Slurm jobs, whose tests
# bound how long a job takes to stop, keep the CPU first
BACKGROUND_NICE = 5


def run_train(config: Path, seed: int, log: Path, *, timeout: float | None = None,
              extra_args: tuple = (), background: bool = False) -> subprocess.CompletedProcess:
    """`python -m llama31_405b train`; background: at lower priority, with a longer timeout."""
    nice = ["nice", "-n", str(BACKGROUND_NICE)] if background else []
    timeout = timeout or (1800 if background else 900)
    return subprocess.run([*nice, sys.executable, "-m", "llama31_405b", "train", "--config",
                           str(config), "--seed", str(seed), "--log", str(log), *extra_args],
                          cwd=REPO, env=py_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def tiny_run_seeds(shared_dir) -> list[int]:
    """The seeds of the NUM_TINY_RUNS tiny runs, drawn once per session from the system's
    entropy (as `launch env` draws them for a config without run.seed_base) and shared by all
    workers: a test can start its own run with one of them before the tiny runs are done."""
    path = shared_dir / "tiny_run_seeds.json"
    with _locked(shared_dir / "tiny_run_seeds.lock"):
        if not path.exists():
            from llama31_405b.config.seeds import run_seeds
            path.write_text(json.dumps(run_seeds(None, NUM_TINY_RUNS)))
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def tiny_runs(tiny_env, tiny_run_seeds, shared_dir) -> list[Path]:
    """MLPerf logs of NUM_TINY_RUNS completed tiny runs, each with a seed drawn from the
    system's entropy (tiny_run_seeds; recorded as "seed" in result_<i>.json beside the log)."""
    seeds = tiny_run_seeds
    logdir = shared_dir / "tiny_runs"
    with _locked(shared_dir / "tiny_runs.lock"):
        logdir.mkdir(exist_ok=True)
        logs = [logdir / f"result_{i}.txt" for i in range(NUM_TINY_RUNS)]
        todo = [i for i in range(NUM_TINY_RUNS) if not logs[i].with_suffix(".json").exists()]
        # the runs are single-threaded (OMP_NUM_THREADS=1): started together they use the CPU
        # time the Slurm tests leave idle while they wait on jobs
        with ThreadPoolExecutor(max_workers=NUM_TINY_RUNS) as pool:
            for i, r in zip(todo, pool.map(
                    lambda i: run_train(tiny_env["config"], seeds[i], _fresh(logs[i]),
                                     background=True), todo)):
                logs[i].with_suffix(".json").write_text(json.dumps(
                    {"rc": r.returncode, "seed": seeds[i], "stderr": r.stderr[-4000:]}))
    failed = tiny_run_failures(logs)
    if failed:
        pytest.fail("tiny runs failed:\n" + "\n".join(failed), pytrace=False)
    return logs


def _fresh(log: Path) -> Path:
    log.unlink(missing_ok=True)
    return log


def tiny_run_failures(logs: list[Path]) -> list[str]:
    """One line (+ the end of stderr) per tiny run whose `train` exited non-zero; a failed run
    must never be read as a result."""
    out = []
    for log in logs:
        rec = json.loads(log.with_suffix(".json").read_text())
        if rec["rc"] != 0:
            out.append(f"{log.name}: seed {rec['seed']}, exit status {rec['rc']}; stderr ends:\n"
                       f"{rec['stderr'][-2000:]}")
    return out


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
