"""The order of the parameter all-gathers of a bucketed DDP chunk (issue 44, the fourth reading):
megatron-core 0.19.2 builds `bucket_groups` in reverse order of use, and its
`DistributedDataParallel.start_param_sync` (the interleaved schedule's param_sync_func) walks
them forwards, so the first forward of the bucketed chunk waits for the whole chunk's gather.
Where the project dispatches (train.evaluation._dispatch, every evaluation's GatherAhead), it
dispatches in the order of use; the planner counts Megatron's order for the training step
(planner.simulate.first_gather_s). The orders are recorded on a real DDP chunk
(tests/helpers/dispatch_order_probe.py, one gloo process)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llama31_405b.config.load import load_config
from llama31_405b.planner import fitted
from llama31_405b.planner.context import Context
from llama31_405b.planner.costs import plan
from llama31_405b.planner.simulate import _run, first_gather_s
from conftest import py_env
from helpers.ports import free_port

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "helpers" / "dispatch_order_probe.py"
GB200_128 = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"


def _probe(*extra: str) -> dict:
    r = subprocess.run([sys.executable, str(PROBE), str(REPO / "configs" / "tiny_cpu_gb200.toml"),
                        "--port", str(free_port()), *extra], capture_output=True, text=True,
                       env=py_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_project_dispatches_in_order_of_use_and_megatron_in_reverse():
    ours = _probe()
    assert ours["bucket_groups"] >= 4                       # several groups: an order to get wrong
    assert ours["used"] == list(range(ours["bucket_groups"]))[::-1]   # DDP's list: reverse of use
    assert ours["dispatched"] == ours["used"]
    theirs = _probe("--megatron")
    # megatron-core 0.19.2's own order, which the planner counts; a version that changes it
    # makes planner.simulate.first_gather_s stale, and this line says so
    assert theirs["dispatched"] == theirs["used"][::-1]


def test_the_planner_counts_megatrons_order_for_the_interleaved_first_chunk():
    ctx = Context.of(load_config(GB200_128))
    p = plan(ctx, fitted())
    first = p.chunks[0][0]
    assert ctx.vp > 1 and p.overlap_param and first.buckets > 1
    assert first_gather_s(first, aligned=True) == first.gather_s
    assert first_gather_s(first, aligned=False) == pytest.approx(
        first.gather_s * first.last_bucket_share)
    # pipeline rank 0's first forward starts at 0 and waits for chunk 0's whole gather
    rank0 = _run(p, ctx.microbatches, rank=0)
    assert rank0.dp_wait_s >= first.gather_s - 1e-12
