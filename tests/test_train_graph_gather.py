"""The captured training graph gathers the parameters whatever the Python state at capture time
(train.graphs: the DDP gather dispatch state is reset right before the training capture).

configs/tiny_cpu_gb200.toml at VP 1 (PP2 x DP2, distributed optimizer, overlapped parameter gather
chained bucket to bucket by the DDP pre-hooks), the full-iteration graphs stood in for by the
replay double (tests/helpers/graph_double.py), captured on the first timed step right after the
restore's forced gather (`run.warmup_iters = 1`, set past the validator). Every replayed training
step, checked before the optimizer step that follows it, holds on every rank the parameters a
forced synchronous gather gives. Without the reset the capture records no gather and the
replays train on the other ranks' stale shards: the worker's `no-reset` argument runs the same
with the reset disabled (measured: every rank captured with every flag true, and 302,942 to
536,034 elements per rank and replay differed from the forced gather), the check that this test
can fail."""
import json

import pytest

from conftest import REPO
from helpers import zygote

pytestmark = pytest.mark.slow
WORKER = REPO / "tests" / "helpers" / "capture_gather_worker.py"
OVERRIDES = {"parallel": {"vp": 1},
             "run": {"division": "open", "max_steps": 3},
             "eval": {"first_step": 3, "interval_steps": 1, "samples": 8, "target": 1.0},
             "optimizer": {"lr": 0.003, "warmup_steps": 1, "decay_steps": 100}}


def _run(tiny_env, tmp, *extra) -> dict:
    cfg = tmp / "gb200_cpu_vp1.toml"
    cfg.write_text(f'base = "{REPO / "configs/tiny_cpu_gb200.toml"}"\n\n'
                   f'[data]\ndata_dir = "{tiny_env["data_dir"]}"\n\n'
                   f'[checkpoint]\nckpt_dir = "{tmp}"\n')
    out = tmp / "out.json"
    r = zygote.run_script(WORKER, [cfg, json.dumps(OVERRIDES), out, *extra], 4, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def rec(tiny_env, tmp_path_factory):
    return _run(tiny_env, tmp_path_factory.mktemp("gather"))


def test_the_capture_follows_a_forced_gather_at_vp1(rec):
    for rank, r in enumerate(rec["ranks"]):
        assert r["vp"] is None                      # VP 1: no align_param_gather
        # the training capture came right after a forced gather: every flag set, reset once
        assert len(r["before_reset"]) == 1 and r["before_reset"][0], f"rank {rank}"
        assert all(r["before_reset"][0]), f"rank {rank}: {r['before_reset']}"
    assert sum(r["chained_gathers"] for r in rec["ranks"]) >= 1
    assert rec["replays"]["training"] == 2          # steps 2 and 3 replay step 1's capture


def test_every_replayed_step_trains_on_the_weights_of_the_last_optimizer_step(rec):
    for rank, r in enumerate(rec["ranks"]):
        assert r["capture_flags"] and not any(r["capture_flags"]), \
            f"rank {rank}: the training graph was captured with gathers marked dispatched"
        assert r["checks"] == [[1, 0], [2, 0]], f"rank {rank}: stale parameters after a replay"
