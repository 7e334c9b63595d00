"""First contact's slice on the GB200 settings (configs/tiny_cpu_gb200.toml: BF16 parameters,
whose RMSNorm weights megatron-core 0.19.2's WrappedTorchNorm makes in FP32 and its
Float16Module casts to BF16), run on the CPU in this process: every slice check passes, and the
two weight comparisons can fail: a warm-up restore that leaves one weight changed is reported
naming that weight alone, and training steps that move no weight are reported.

The three runs share one worker (one xdist group), so megatron-core and torch are imported once
(about 10 s of the group's ~40 s of CPU)."""
from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import REPO
from llama31_405b import first_contact as fc
from llama31_405b.first_contact import slice as fc_slice

GB200_TINY = REPO / "configs" / "tiny_cpu_gb200.toml"
CHANGED = "decoder.layers.0.mlp.linear_fc1.weight"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("first_contact_gb200")]


def _slice(monkeypatch, tmp_path, steps: int = 1):
    monkeypatch.setattr(os, "environ", dict(os.environ))     # run_checks exports launch_env
    return fc.run_checks(GB200_TINY, steps=steps, phases=("slice",), cpu=True,
                         report_path=tmp_path / "slice.json", workdir=str(tmp_path / "work"))


def test_the_cpu_rehearsal_on_the_gb200_settings_passes(monkeypatch, tmp_path, capsys):
    """`first-contact --cpu --config configs/tiny_cpu_gb200.toml --phases slice --steps 1`
    (issue 43 point 3: it exited 1, the three norm weights "differing" by their dtype alone)."""
    monkeypatch.setattr(os, "environ", dict(os.environ))
    report = tmp_path / "report.json"
    status = fc.main(["--cpu", "--config", str(GB200_TINY), "--phases", "slice", "--steps", "1",
                      "--report", str(report), "--workdir", str(tmp_path / "work")])
    out = capsys.readouterr()
    by = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    assert status == 0, out.out[-3000:] + out.err[-3000:]
    for name in fc.PHASES["slice"]:
        assert by[name]["status"] == "passed", (name, by[name])
    # the norms: FP32 as built and saved, BF16 as the wrapped model holds them after the load
    assert "float32 -> bfloat16 by the BF16 wrapper" in by["checkpoint_load"]["detail"]
    assert "weights bitwise as loaded" in by["warmup_and_graphs"]["detail"]
    assert by["build"]["data"]["memory_estimate_gib"]["host"] < 3     # module fit


def test_a_restore_that_leaves_one_weight_changed_is_reported(monkeypatch, tmp_path):
    from llama31_405b.model.builder import unwrap
    from llama31_405b.train.warmup import RestorePoint
    real = RestorePoint.restore

    def restore_but_one(self, model, optimizer):
        real(self, model, optimizer)
        w = dict(unwrap(model[0]).named_parameters())[CHANGED]
        with torch.no_grad():
            w.view(-1)[0] += 1.0                   # one element, far above BF16 resolution
    monkeypatch.setattr(RestorePoint, "restore", restore_but_one)
    rep = _slice(monkeypatch, tmp_path)
    c = rep.checks["warmup_and_graphs"]
    assert c.status == "failed"
    assert c.detail == ("RuntimeError: after the warm-up restore 1 parameters differ from the "
                        f"weights as loaded: {[CHANGED]}")
    assert rep.checks["checkpoint_load"].status == "passed"
    assert rep.checks["steps"].status == "not run"


def test_steps_that_move_no_weight_are_reported(monkeypatch, tmp_path):
    """A learning rate of 0 (the rules' schedule at the slice's GBS of 2 starts at ~3e-14, which
    moves no BF16 weight either: slice.SLICE_LR) through warm-up and steps."""
    monkeypatch.setattr(fc_slice, "SLICE_LR", 0.0)
    rep = _slice(monkeypatch, tmp_path)
    for name in ("checkpoint_load", "warmup_and_graphs", "replay_equals_eager"):
        assert rep.checks[name].status == "passed", (name, rep.checks[name].detail)
    c = rep.checks["steps"]
    assert c.status == "failed"
    assert c.detail == "RuntimeError: the optimizer steps left every weight unchanged"
