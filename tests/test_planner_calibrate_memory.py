"""The memory check with a calibration (issue 39): a GPU profile records the allocator's peaks
(profile/capture.py), `plan --calibrate` fits the memory model's activation scale and
fragmentation to them, and `config check`, `compliance precheck`, the launch pre-flight and
`plan`'s memory column use them with `--calibration FILE`. A calibration without a memory record
(every CPU profile) leaves the memory model as it was; one of another system, model or precision
is refused there too (docs/planner.md, "Calibrating from a profile")."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from llama31_405b.cli import main
from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, predict
from llama31_405b.planner.calibrate.synthetic import synthetic_profile
from llama31_405b.planner.capacity import memory_problems, predicted
from llama31_405b.planner.compute import gemm_precision
from llama31_405b.planner.context import Context

REPO = Path(__file__).resolve().parents[1]
GB200 = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"
MEMORY = dict(activation_scale=1.3, activation_fragmentation=0.35)


def calibration(tmp: Path, name: str, cfg, fit, with_memory: bool) -> Path:
    """A calibration file fitted (calibrate.solve, the path `plan --calibrate` takes) to a
    synthetic profile of `cfg` the planner writes with the constants `fit`."""
    folder = synthetic_profile(tmp / f"profile_{name}", cfg, fit, with_memory=with_memory)
    summary = calibrate.from_profile(folder, cfg)
    got = calibrate.solve(summary, cfg)
    return calibrate.write(tmp / f"{name}.toml", summary, got, gemm_precision(Context.of(cfg)), {})


def test_memory_constants_round_trip_through_a_profile_with_a_memory_record(tmp_path):
    cfg = load_config(GB200)
    truth = replace(calibrate.fitted(), **MEMORY)
    path = calibration(tmp_path, "mem", cfg, truth, with_memory=True)
    cal = calibrate.read(path)
    assert cal.summary.memory_allocated_gb is not None
    assert cal.fit.activation_scale == pytest.approx(1.3, rel=1e-9)
    assert cal.fit.activation_fragmentation == pytest.approx(0.35, rel=1e-9)
    want = predicted(cfg, truth)
    got = predicted(cfg, cal.fit)
    assert got.total_gb == pytest.approx(want.total_gb, rel=1e-9)
    assert got.activations_gb == pytest.approx(1.3 * predicted(cfg).activations_gb, rel=1e-9)
    # plan's memory column takes them too
    assert predict(cfg, cal.fit).memory_per_gpu_gb == pytest.approx(want.total_gb, rel=1e-9)


def test_a_calibration_without_a_memory_record_leaves_the_memory_model_unchanged(tmp_path):
    cfg = load_config(GB200)
    path = calibration(tmp_path, "nomem", cfg, replace(calibrate.fitted(), **MEMORY),
                       with_memory=False)
    fit = calibrate.read(path).fit
    assert (fit.activation_scale, fit.activation_fragmentation) == (1.0, None)
    assert predicted(cfg, fit) == predicted(cfg)
    assert "activation_fragmentation" not in Path(path).read_text()


def test_the_memory_check_uses_the_calibration_and_refuses_another_systems(tmp_path, capsys):
    cfg = load_config(GB200)
    assert memory_problems(cfg) == []
    # a measured activation footprint three times the model's: the config no longer fits
    big = calibration(tmp_path, "big", cfg, replace(calibrate.fitted(), activation_scale=3.0,
                                                    activation_fragmentation=0.2), with_memory=True)
    assert main(["config", "check", str(GB200)]) == 0
    capsys.readouterr()
    assert main(["config", "check", str(GB200), "--calibration", str(big)]) == 2
    err = capsys.readouterr().err
    assert "predicted memory per GPU does not fit gb200-nvl72" in err
    rc = main(["plan", "--config", str(GB200), "--calibration", str(big), "--json"])
    out = capsys.readouterr().out
    assert rc == 0 and json.loads(out)["fits"] is False
    # a CPU calibration (no memory record) is refused for the GB200 config, before any check
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(f'base = "{REPO / "configs" / "tiny_cpu.toml"}"\n\n[parallel]\ntp = 2\npp = 2\n\n'
                    '[batch]\nminibs = 4\n\n[system]\ngpus_per_rack = 8\nracks = 1\n')
    cpu = calibration(tmp_path, "cpu", load_config(tiny), calibrate.fitted(), with_memory=False)
    for argv in (["config", "check", str(GB200)], ["compliance", "precheck", str(GB200)]):
        assert main([*argv, "--calibration", str(cpu)]) == 2
        err = capsys.readouterr().err
        assert "calibrated for system.id = 'cpu', the config has 'gb200-nvl72'" in err, argv
    assert main(["config", "check", str(tiny), "--calibration", str(cpu)]) == 0
