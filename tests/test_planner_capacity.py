"""Memory before launch: `config check`, `compliance precheck` and the launch pre-flight refuse
a GPU config the planner predicts does not fit, name the breakdown and what would fit, accept the
risk when the config says so (and say it), and pass every shipped config."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llama31_405b.cli import main
from llama31_405b.config.load import load_config
from llama31_405b.planner.capacity import memory_note, memory_problems

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PARTS = ("weights", "grads", "optimizer", "activations", "fragmentation", "reserved")


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, Path]:
    """TP2-PP8-CP2 at 128 racks on GB200 and GB300, and the GB200 one accepting the risk."""
    d = tmp_path_factory.mktemp("capacity")
    (d / "base").mkdir()
    shutil.copy(CONFIGS / "base" / "gb200_405b.toml", d / "base")
    body = ('base = "base/gb200_405b.toml"\n[parallel]\ntp = 2\n[batch]\nminibs = 8\n'
            '[run]\nmax_steps = 300\n[system]\nracks = 128\n')
    (d / "gb200.toml").write_text(body)
    (d / "gb300.toml").write_text(body + 'id = "gb300-nvl72"\n')
    (d / "risk.toml").write_text('base = "gb200.toml"\n[run]\naccept_memory_risk = true\n')
    return {k: d / f"{k}.toml" for k in ("gb200", "gb300", "risk")}


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def assert_refusal(text: str):
    assert "does not fit gb200-nvl72" in text
    assert all(p in text for p in PARTS), text
    assert 'performance.recompute = "full"' in text and "parallel.tp = 4" in text
    assert "run.accept_memory_risk = true" in text


def test_memory_verdict(configs):
    gb200, gb300, risk = (load_config(configs[k]) for k in ("gb200", "gb300", "risk"))
    (problem,) = memory_problems(gb200)
    assert_refusal(problem)
    assert memory_problems(gb300) == [] and memory_note(gb300) is None
    assert memory_problems(risk) == []
    assert "accepted" in memory_note(risk) and "DOES NOT FIT" in memory_note(risk)


def test_config_check_refuses_it(configs, capsys):
    rc, out, err = run(capsys, "config", "check", str(configs["gb200"]))
    assert rc == 2  # a config predicted not to fit: bad input (docs/cli.md)
    assert_refusal(err)
    rc, out, err = run(capsys, "config", "check", str(configs["gb300"]))
    assert rc == 0 and out.startswith("ok")
    rc, out, err = run(capsys, "config", "check", str(configs["risk"]))
    assert rc == 0 and "run.accept_memory_risk = true: memory risk accepted" in out


def test_compliance_precheck_refuses_it(configs, capsys):
    rc, out, err = run(capsys, "compliance", "precheck", str(configs["gb200"]))
    assert rc == 1 and "memory: " in err
    assert_refusal(err)
    rc, out, err = run(capsys, "compliance", "precheck", str(configs["gb300"]))
    assert rc == 0 and "PASS" in out and "memory" not in err
    rc, out, err = run(capsys, "compliance", "precheck", str(configs["risk"]))
    assert rc == 0 and "memory risk accepted" in out


def test_launch_preflight_refuses_it_before_any_process_group(configs, capsys, monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    rc, out, err = run(capsys, "launch", "preflight", "--config", str(configs["gb200"]))
    assert rc == 2
    assert_refusal(err)
    # the GB300 config passes the memory check and goes on to the placement check, which one
    # process cannot pass (exit 3): no memory error on the way
    rc, out, err = run(capsys, "launch", "preflight", "--config", str(configs["gb300"]))
    assert rc == 3 and "memory" not in err
    rc, out, err = run(capsys, "launch", "preflight", "--config", str(configs["risk"]))
    assert rc == 3 and "memory risk accepted" in out


def test_every_shipped_config_fits():
    paths = sorted(CONFIGS.glob("*.toml"))
    assert len(paths) > 10
    for path in paths:
        cfg = load_config(path)
        assert memory_problems(cfg) == [], path
        assert memory_note(cfg) is None, path
