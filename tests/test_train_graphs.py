"""Full-iteration CUDA graphs: every training and evaluation microbatch goes through megatron's
FullCudaGraphWrapper. A tiny CPU run with torch's graph capture API replaced by a recorder
(tests/helpers/graph_probe.py; the wrapper itself is megatron-core 0.19.2's, unpatched)."""
import json

import pytest

from conftest import REPO
from helpers import zygote

pytestmark = pytest.mark.slow
PROBE = REPO / "tests" / "helpers" / "graph_probe.py"
OVER = {"run": {"division": "open", "max_steps": 3, "warmup_iters": 2},
        "eval": {"first_step": 2, "interval_steps": 1, "samples": 8},
        "performance": {"cuda_graphs": "full_iteration"}}


@pytest.fixture(scope="module")
def rec(tiny_env, tmp_path_factory):
    out = tmp_path_factory.mktemp("graphs") / "graphs.json"
    # `python PROBE ...` forked from the preloaded zygote (tests/helpers/zygote.py)
    r = zygote.run_script(PROBE, [str(tiny_env["config"]), json.dumps(OVER),
                                 str(out)], timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(out.read_text())
    assert got["reason"].startswith("target"), got["reason"]
    return got


def test_both_graphs_are_captured_during_the_warmup(rec):
    assert rec["captures"] == [{"stage": "training", "phase": "init"},
                               {"stage": "validation", "phase": "init"}]
    assert rec["registered"] > 0      # the RNG states are registered with each graph


def test_every_timed_training_microbatch_goes_through_the_graph(rec):
    run = [r for r in rec["replays"] if r["phase"] == "run"]
    train = [r["tokens"] for r in run if r["stage"] == "training"]
    assert train == rec["expected_train"] and len(train) == 3   # one replay per step, in order
    # nothing ran outside the graph after run_start
    assert [f for f in rec["forwards"] if f["phase"] == "run"] == []


def test_every_evaluation_microbatch_goes_through_the_graph(rec):
    run = [r for r in rec["replays"] if r["phase"] == "run"]
    evals = [r["tokens"] for r in run if r["stage"] == "validation"]
    assert rec["evals"] == [2, 3]
    assert evals == [rec["expected_eval"]] * 2


def test_warmup_feeds_synthetic_microbatches_through_the_static_buffers(rec):
    warm = [f for f in rec["forwards"] if f["phase"] == "init"]
    # training: an eager iteration and the captured one; evaluation: an eager pass and the
    # captured one; 4 microbatches each (MiniBS 8 / MBS 2; 8 eval samples / MBS 2)
    assert [f["stage"] for f in warm] == ["training"] * 8 + ["validation"] * 8
    assert all(f["static"] for f in warm)
    real = {t for step in rec["expected_train"] for t in step} | set(rec["expected_eval"])
    assert not real & {f["tokens"] for f in warm}
