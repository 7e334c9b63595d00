"""first-contact's DP 2 phase can fail: its training-graph check sees a training graph captured
without the gather-dispatch reset (train.gather_dispatch.reset, which train.graphs runs right
before the training capture), and its reference evaluation reads no weight that a gather is
still writing.

The phase's two gloo ranks run on the CPU (configs/tiny_cpu_gb200.toml's slice: one layer, BF16
parameters, DP 2, distributed optimizer, overlapped parameter gather, several DDP buckets chained
by the forward pre-hooks) with the full-iteration graphs stood in for by the replay double
(tests/helpers/graph_double.py, installed in each rank by tests/helpers/dp2_worker.py). The
phase puts its training capture on the first step, right after the warm-up restore's forced
gather: with the reset the capture records the gathers and the replayed step trains on the
synchronised weights; without it (a no-op in the ranks) it records none, and the replay trains
on the other rank's shard of the step before, which the check reports."""
import json

import pytest

from conftest import REPO
from llama31_405b.first_contact import dp2
from llama31_405b.first_contact.report import Report

pytestmark = pytest.mark.slow
CONFIG = REPO / "configs" / "tiny_cpu_gb200.toml"
WORKER = REPO / "tests" / "helpers" / "dp2_worker.py"


def _phase(tmp_path_factory, no_reset: bool) -> tuple:
    probe = tmp_path_factory.mktemp("dp2_no_reset" if no_reset else "dp2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dp2, "WORKER", (str(WORKER),))
        mp.setenv("DP2_PROBE_DIR", str(probe))
        mp.setenv("DP2_NO_RESET", "1" if no_reset else "0")
        rep = Report(path=probe / "out" / "report.json")
        dp2.run_dp2_phase(rep, CONFIG, layers=1, seq_length=64, steps=2, cpu=True,
                          system=None, compute="bf16", timeout_s=600)
    ranks = [json.loads((probe / f"rank{r}.json").read_text()) for r in range(2)]
    # the ranks' logs stay beside the report file, in the folder the check's detail names
    logs = [d for d in (probe / "out").iterdir() if d.name.startswith("first_contact_dp2_")]
    assert len(logs) == 1 and str(logs[0]) in rep.checks["dp2_eval_sync"].detail
    assert {f.name for f in logs[0].iterdir()} >= {"rank0.log", "rank1.log", "result.json"}
    return rep.checks["dp2_eval_sync"], ranks


@pytest.fixture(scope="module")
def with_reset(tmp_path_factory):
    return _phase(tmp_path_factory, no_reset=False)


@pytest.fixture(scope="module")
def without_reset(tmp_path_factory):
    return _phase(tmp_path_factory, no_reset=True)


def test_with_the_reset_the_replayed_training_step_is_synchronised(with_reset):
    check, ranks = with_reset
    assert check.status == "passed", check.detail
    assert all(r["train_replay_synchronised"] for r in check.data["ranks"])
    assert check.data["graphs"] is True
    for probe in ranks:
        assert probe["resets_replaced"] == 0
        # the training graph was captured with every gather to dispatch, and replayed
        assert probe["captures"]["training"] and not any(probe["captures"]["training"])
        assert probe["replays"]["training"] >= 2


def test_without_the_reset_the_check_fails(without_reset):
    check, ranks = without_reset
    assert check.status == "failed", check.detail
    assert "STALE TRAINING GRAPH" in check.detail
    for r in check.data["ranks"]:
        assert not r["train_replay_synchronised"] and r["train_stale_buffers"] > 0, r
    for probe in ranks:
        assert probe["resets_replaced"] >= 2      # train.graphs' and train.evaluation's
        # captured right after the restore's forced gather: every gather marked dispatched
        assert probe["captures"]["training"] and all(probe["captures"]["training"])


def test_no_evaluation_reads_a_weight_its_gather_is_still_writing(with_reset):
    """The reference evaluation (pre-hooks disabled after a forced synchronous gather) used to
    run through train.evaluation.GatherAhead, which dispatched an asynchronous all-gather that
    no pre-hook waited for while the forward passes read the parameters."""
    _, ranks = with_reset
    for probe in ranks:
        evals = probe["evaluations"]
        assert [e["pre_hooks"] for e in evals].count(False) == 1, evals   # the reference
        assert all(e["in_flight_reads"] == 0 for e in evals), evals
