"""first-contact's DP 2 phase needs a training step: its replayed training step follows the
first optimizer step. --steps 0 is refused before any rank starts (it used to reach the end of
both ranks' init and fail there on a hash that was never taken)."""
from pathlib import Path

import pytest

from llama31_405b.first_contact import dp2
from llama31_405b.first_contact.report import Report

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny_cpu.toml"


def test_the_phase_refuses_zero_steps_before_starting_a_rank(tmp_path):
    rep = Report()
    dp2.run_dp2_phase(rep, TINY, layers=1, seq_length=64, steps=0, cpu=True, system=None,
                      compute="fp32")
    c = rep.checks["dp2_eval_sync"]
    assert c.status == "failed"
    assert "--steps 0" in c.detail and "at least 1 training step" in c.detail


def test_a_rank_refuses_zero_steps_before_its_init(capsys):
    with pytest.raises(SystemExit) as e:
        dp2.worker(["--config", str(TINY), "--seq-length", "64", "--steps", "0",
                    "--compute", "fp32", "--cpu", "--result", "unused.json"])
    assert e.value.code == 2
    assert "--steps 0: at least 1" in capsys.readouterr().err
