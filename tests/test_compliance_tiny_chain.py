"""The tiny chain on real tiny runs: three completed tiny_llama31 runs with distinct seeds (the
session fixture `tiny_runs`, provided by the training tests in tests/conftest.py) through the tiny
rules (compliance/tiny_llama31.yaml) and the tiny RCP check (compliance/tiny_llama31_rcps.json).
The assertions make sure every checker actually ran (nothing skipped)."""
import shutil
from pathlib import Path

import pytest
from mlperf_logs import set_value

from llama31_405b.config import load_config
from llama31_405b.mlperf.checker import check_log
from llama31_405b.mlperf.log import load_run
from llama31_405b.submission.package import PackageError, package

REPO = Path(__file__).resolve().parents[1]
# the tiny_runs fixture trains three tiny runs to the target: `make test-stress`
pytestmark = [pytest.mark.slow, pytest.mark.converge]


def _copy(paths, dst: Path) -> list[Path]:
    dst.mkdir(parents=True)
    out = []
    for i, p in enumerate(paths):
        out.append(dst / f"result_{i}.txt")
        shutil.copyfile(p, out[-1])
    return out


def test_tiny_runs_pass_the_tiny_chain(tiny_runs, tmp_path):
    assert len(tiny_runs) == 3
    runs = [load_run(p) for p in tiny_runs]
    assert len({r.seed for r in runs}) == 3
    assert {r.benchmark for r in runs} == {"tiny_llama31"}
    for p in tiny_runs:
        res = check_log(p)
        assert res.ok, res.details()
        assert [Path(r).name for r in res.rule_files] == ["tiny_llama31.yaml"]
    _copy(tiny_runs, tmp_path / "logs")
    res = package(tmp_path / "logs", out=tmp_path / "out", org="reference",
                  cfg=load_config(REPO / "configs" / "tiny_cpu.toml"))
    names = [s.name for s in res.steps]
    for want in ("compliance checker", "system description checker", "seed checker"):
        assert want in names
    assert any(n.startswith("RCP checker") for n in names)
    for step in res.steps:
        assert step.ok and not step.skipped, step.line()
        assert "Skipping" not in step.detail
    assert res.ok and res.score_min is not None


def test_a_wrong_value_in_a_tiny_log_fails(tiny_runs, tmp_path):
    logs = _copy(tiny_runs, tmp_path / "logs")
    set_value(logs[0], "eval_samples", 65)
    res = check_log(logs[0])
    assert not res.ok and any("'eval_samples'" in s for s in res.summary())
    set_value(logs[2], "opt_learning_rate_warmup_steps", 1)   # recomputed by the checker: passes
    set_value(logs[2], "opt_learning_rate_decay_steps", 1)
    with pytest.raises(PackageError) as e:
        package(tmp_path / "logs", out=tmp_path / "out", org="reference",
                cfg=load_config(REPO / "configs" / "tiny_cpu.toml"))
    assert str(logs[0]) in str(e.value) and str(logs[2]) in str(e.value)
