"""Seeds: a config without run.seed_base (the GB200 configs) gets a fresh seed per run from the
operating system's entropy, in `launch env` and in `train` without --seed; configs that fix a base
(the tiny ones) keep seed_base + i; three tiny runs with entropy seeds pass the package's seed
check."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llama31_405b.cli import main
from llama31_405b.config import load_config
from llama31_405b.config.seeds import SEED_BITS, run_seeds

REPO = Path(__file__).resolve().parents[1]
GB200 = sorted((REPO / "configs").glob("config_GB200_*.toml"))
TINY = sorted((REPO / "configs").glob("tiny_*.toml"))


def _seeds(text: str) -> list[int]:
    return [int(s) for s in re.search(r"^LAUNCH_SEEDS=\(([^)]*)\)$", text, re.M).group(1).split()]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO))


def test_gb200_configs_draw_their_seeds_and_tiny_configs_fix_them():
    for path in GB200:
        assert load_config(path).run.seed_base is None, path.name
    for path in TINY:
        assert load_config(path).run.seed_base == 1, path.name


def test_two_launch_env_calls_give_different_seeds():
    """The real command, twice, on a GB200 config: fresh, distinct seeds each time."""
    cmd = [sys.executable, "-m", "llama31_405b", "launch", "env", str(GB200[0])]
    first, second = (_seeds(subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True,
                                           text=True, check=True).stdout) for _ in range(2))
    assert len(first) == len(second) == 3
    assert len(set(first)) == 3 and len(set(second)) == 3
    assert set(first).isdisjoint(second)
    assert all(0 <= s < 2**SEED_BITS for s in first + second)


def test_seeds_come_from_os_urandom(monkeypatch, capsys):
    """`launch env` takes its seeds from os.urandom (the system's entropy source), and a value
    it draws twice is drawn again: the runs of a submission need distinct seeds."""
    draws = iter([b"\x00" * 7 + b"\x80", b"\x00" * 7 + b"\x80", b"\xff" * 8,
                  b"\x00" * 4 + b"\x02" + b"\x00" * 3])
    calls = []

    def urandom(n):
        calls.append(n)
        return next(draws)
    monkeypatch.setattr(os, "urandom", urandom)
    assert main(["launch", "env", str(GB200[0])]) == 0
    # little-endian 64 bits, top 31 kept: 2**63 -> 2**30; all ones -> 2**31 - 1; 2**33 -> 1
    assert _seeds(capsys.readouterr().out) == [2**30, 2**31 - 1, 1]
    assert calls == [8, 8, 8, 8]
    # a base given on the command line (run_and_time.sh's SEED_BASE) draws nothing
    assert main(["launch", "env", str(GB200[0]), "--seed-base", "40"]) == 0
    assert _seeds(capsys.readouterr().out) == [40, 41, 42] and len(calls) == 4


def test_tiny_configs_keep_seed_base_plus_i():
    assert run_seeds(1, 3) == (1, 2, 3)
    out = subprocess.run([sys.executable, "-m", "llama31_405b", "launch", "env",
                          "configs/tiny_cpu.toml"], cwd=REPO, env=_env(), capture_output=True,
                         text=True, check=True).stdout
    assert _seeds(out) == [1, 2, 3]


def test_train_without_seed(monkeypatch, capsys):
    """`train` without --seed: the config's seed_base, else one entropy seed on a single process;
    on several ranks each would draw another one, so it refuses (run_and_time.sh passes --seed)."""
    from llama31_405b.cli.train_cmd import run_seed
    gb200, tiny = load_config(GB200[0]), load_config(REPO / "configs" / "tiny_cpu.toml")
    monkeypatch.setattr(os, "urandom", lambda n: b"\x00" * 4 + b"\x04" + b"\x00" * 3)
    assert run_seed(gb200, None, environ={}) == 2          # 2**34 >> 33
    assert run_seed(gb200, 77, environ={}) == 77
    assert run_seed(tiny, None, environ={}) == 1
    assert run_seed(gb200, None, environ={"RANK": "0", "WORLD_SIZE": "8"}) is None
    assert "pass --seed N" in capsys.readouterr().err
    assert run_seed(gb200, 5, environ={"RANK": "0", "WORLD_SIZE": "8"}) == 5


@pytest.mark.slow
@pytest.mark.converge
def test_package_accepts_three_tiny_runs_with_entropy_seeds(tiny_runs, tmp_path):
    """The session's three tiny runs (seeds drawn from the system's entropy, as for a config
    without run.seed_base) log their seeds, and `submission package`'s seed check passes."""
    from llama31_405b.mlperf.log import load_run
    from llama31_405b.submission.package import package
    drawn = [json.loads(p.with_suffix(".json").read_text())["seed"] for p in tiny_runs]
    logged = [load_run(p).seed for p in tiny_runs]
    assert logged == drawn and len(set(logged)) == 3
    assert logged != [1, 2, 3]                       # not the tiny config's seed_base + i
    logs = tmp_path / "logs"
    logs.mkdir()
    for i, p in enumerate(tiny_runs):
        shutil.copyfile(p, logs / f"result_{i}.txt")
    res = package(logs, out=tmp_path / "out", org="reference",
                  cfg=load_config(REPO / "configs" / "tiny_cpu.toml"))
    seed = [s for s in res.steps if s.name == "seed checker"]
    assert len(seed) == 1 and seed[0].ok and not seed[0].skipped, [s.line() for s in res.steps]
    assert str(logged) in seed[0].detail
