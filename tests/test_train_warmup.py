"""Warm-up before run_start (synthetic tokens, optimizer steps, evaluation passes) restored in
place, no dataset access before run_start, and manual GC in training and evaluation: two short
tiny runs under observation (tests/helpers/run_probe.py), without and with warm-up."""
import json

import pytest

from conftest import REPO
from helpers import zygote

pytestmark = pytest.mark.slow
PROBE = REPO / "tests" / "helpers" / "run_probe.py"
WARMUP = 3
SHORT = {"run": {"division": "open", "max_steps": 4},
         "eval": {"first_step": 2, "interval_steps": 2, "samples": 8},
         "performance": {"manual_gc": True, "manual_gc_interval": 2}}


def _probe(tiny_env, tmp_path, warmup: int) -> dict:
    over = json.loads(json.dumps(SHORT))
    over["run"]["warmup_iters"] = warmup
    out = tmp_path / f"probe_{warmup}.json"
    # `python PROBE ...` forked from the preloaded zygote (tests/helpers/zygote.py)
    r = zygote.run_script(PROBE, [str(tiny_env["config"]), json.dumps(over),
                                 str(out)], timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    rec = json.loads(out.read_text())
    assert rec["reason"].startswith("target"), rec["reason"]   # ran to max_steps
    return rec


@pytest.fixture(scope="module")
def probes(tiny_env, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("warmup")
    return _probe(tiny_env, tmp, 0), _probe(tiny_env, tmp, WARMUP)


def test_warmup_leaves_the_run_bitwise_unchanged(probes):
    cold, warm = probes
    assert len(cold["losses"]) == 4 and [s for s, _ in cold["evals"]] == [2, 4]
    assert warm["losses"] == cold["losses"]              # exact floats
    assert warm["evals"] == cold["evals"]
    assert warm["weights_sha256"] == cold["weights_sha256"]


def test_warmup_steps_the_optimizer_and_evaluates_with_state_restored_in_place(probes):
    cold, warm = probes
    assert cold["opt_steps_before_run_start"] == 0
    assert warm["opt_steps_before_run_start"] == WARMUP
    assert warm["eval_passes_before_run_start"] >= 1
    # every parameter, master weight and Adam state tensor the warm-up created or touched is
    # where it was after the last warm-up step: restored in place (CUDA graphs hold addresses)
    after, start = warm["ptr_after_warmup"], warm["ptr_at_run_start"]
    assert any(".state" in k for k in after), "the warm-up created no optimizer state"
    assert after == start


def test_warmup_reads_no_sample_before_run_start(probes):
    cold, warm = probes
    for rec in (cold, warm):
        assert rec["reads"]["init"] == 0 and rec["reads"]["datasets"] == 0, rec["reads"]
        assert rec["reads"]["run"] > 0
        # outside the dataset construction, nothing before run_start opens or maps a .bin
        assert [e for e in rec["bin"] if e[0] == "init"] == []
        assert any(e[0] == "run" for e in rec["bin"]) or any(e[0] == "datasets" for e in rec["bin"])


def test_no_bin_file_opened_or_mapped_before_run_start(probes):
    _, warm = probes
    before = [e for e in warm["bin"] if e[0] != "run"]
    assert before == []
    assert any(e[0] == "run" for e in warm["bin"])


def test_manual_gc_in_training_and_evaluation(probes):
    _, warm = probes
    # automatic GC is off at every step and around every evaluation
    assert warm["gc_enabled"] and not any(on for *_, on in warm["gc_enabled"])
    phases = [tuple(e) for e in warm["gc"]]
    # a full collection at the end of init, none at the start of the timed run
    assert phases.count(("init", 0)) >= 1
    assert warm["gc_collections_logged"] == [["init", 0], ["train", 2], ["train", 4],
                                              ["eval", 2]]
    # GC runs every 2 training steps and every 2 validation steps (one per evaluation here)
    assert [p for p in phases if p[0] == "run"] == [("run", 2), ("run", 4), ("run", 4)]
