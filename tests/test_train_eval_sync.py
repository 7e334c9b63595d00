"""The GB200 settings on CPU, with CUDA-graph replay semantics: configs/tiny_cpu_gb200.toml on 4
gloo ranks (PP2 x VP2 x DP2; distributed optimizer, overlapped and aligned parameter gather,
overlapped reduce-scatter, BF16 parameters and gradients, emulated NVFP4, the embedding/loss
pipeline split, several DDP buckets), the full-iteration CUDA graphs stood in for by the replay
double (tests/helpers/graph_double.py), from random weights, for 4 steps with evaluations at
steps 2 and 4.

Every logged evaluation equals, bit for bit, an eager evaluation of the same weights at the same
layout after a forced synchronous parameter gather. Without a gather of its own the evaluation
graph, captured after a pass that had gathered, replays without one and scores this rank's shard
at step k with the other shards at step k-1 (measured before the first fix, a synchronous gather
before every evaluation: 8.15964 logged vs 8.12306 synchronised at step 2; docs/gpu_settings.md).
Now the evaluation gathers inside its pass, each chunk's gather dispatched ahead of its forward
passes (train.evaluation.GatherAhead), and the graph captures those gathers."""
import json

import pytest

from conftest import REPO
from helpers import zygote

pytestmark = pytest.mark.slow
WORKER = REPO / "tests" / "helpers" / "eval_sync_worker.py"
GB200_CPU_CONFIG = "configs/tiny_cpu_gb200.toml"
"""The config this module runs; tests/test_gpu_settings.py checks the rows it exercises against it."""
# run length, evaluation cadence and a learning rate that moves random weights in 4 steps: the
# only changes to the config (none touches a setting of docs/gpu_settings.md)
OVERRIDES = {"run": {"division": "open", "max_steps": 4},
             "eval": {"first_step": 2, "interval_steps": 2, "samples": 8, "target": 1.0},
             "optimizer": {"lr": 0.003, "warmup_steps": 1, "decay_steps": 100}}


@pytest.fixture(scope="module")
def rec(tiny_env, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evalsync")
    cfg = tmp / "gb200_cpu.toml"
    cfg.write_text(f'base = "{REPO / GB200_CPU_CONFIG}"\n\n'
                   f'[data]\ndata_dir = "{tiny_env["data_dir"]}"\n\n'
                   f'[checkpoint]\nckpt_dir = "{tmp}"\n')
    out = tmp / "out.json"
    # torchrun --nproc_per_node=4 WORKER ..., the ranks forked from the preloaded zygote
    # (tests/helpers/zygote.py)
    r = zygote.run_script(WORKER, [cfg, json.dumps(OVERRIDES), out], 4, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out.read_text())


def test_logged_evaluations_score_the_weights_of_their_step(rec):
    assert [e[0] for e in rec["evals"]] == [2, 4]
    for step, logged, forced in rec["evals"]:
        assert logged == forced, (f"step {step}: the logged evaluation {logged!r} is not the "
                                  f"forced-sync evaluation {forced!r} of the same weights")


def test_both_graphs_were_captured_and_replayed(rec):
    assert rec["captured"] == {"training": True, "validation": True}
    # both graphs were captured with no parameter gather dispatched: their replays gather
    # (train.evaluation resets the dispatch state before every evaluation, train.graphs before
    # the training capture)
    assert rec["capture_flags"]["validation"] and not any(rec["capture_flags"]["validation"])
    assert rec["capture_flags"]["training"] and not any(rec["capture_flags"]["training"])
    # 4 timed steps; 2 timed evaluations (the forced-sync ones run eagerly)
    assert rec["replays"] == {"training": 4, "validation": 2}


def test_every_evaluation_gathers_inside_its_pass_dispatched_ahead(rec):
    """train.evaluation.GatherAhead: the logged evaluations' gathers are dispatched
    asynchronously inside the pass (none forced before it), every forward pre-hook finds its
    bucket group's gather already dispatched (chunk 0's before the schedule, chunk 1's when
    chunk 0's first forward starts), so the pre-hooks only wait."""
    for rank, r in enumerate(rec["ranks"]):
        g = r["eval_gathers"]
        groups = sum(c["bucket_groups"] for c in r["chunks"])
        assert g["forced"] == 0, f"rank {rank}: a synchronous gather before the pass: {g}"
        assert g["dispatched"] == 2 * groups, f"rank {rank}: {g}"     # 2 logged evaluations
        assert g["waits"] > 0 and g["not_ahead"] == 0, f"rank {rank}: {g}"


def test_every_gloo_group_runs_one_worker_thread(rec):
    """llama31_405b.gloo_workers: with torch's two worker threads per gloo group, two
    asynchronous parameter all-gathers of one group ran at once and corrupted the heap
    (bench/gloo_async_gather.py); the world and data-parallel groups of every rank run one."""
    for rank, r in enumerate(rec["ranks"]):
        assert r["gloo_threads"] == {"world": 1, "dp": 1}, f"rank {rank}: {r['gloo_threads']}"


def test_the_run_trains(rec):
    assert rec["status"] == "aborted" and rec["reason"].startswith("target"), rec["reason"]
    losses = rec["losses"]
    assert len(losses) == 4 and all(x == x for x in losses)
    assert losses[-1] < losses[0]
    assert rec["evals"][-1][1] < rec["evals"][0][1]


def test_the_gb200_ddp_settings_are_in_effect_on_every_rank(rec):
    ranks = rec["ranks"]
    assert len(ranks) == 4
    for r in ranks:
        assert r["vp"] == 2 and r["account_for_embedding"] and r["account_for_loss"]
        for c in r["chunks"]:
            assert c["use_distributed_optimizer"] and c["overlap_grad_reduce"]
            assert c["overlap_param_gather"] and c["align_param_gather"] and c["forward_pre_hook"]
            assert c["grad_dtype"] == c["param_dtype"] == "torch.bfloat16"
    # 6 layers + embedding + loss over 4 virtual stages: 2 slots each, as 128 on GB200
    # (ranks 0, 2: pipeline rank 0 holds stages 0 and 2; ranks 1, 3: stages 1 and 3)
    assert [r["layers"] for r in ranks] == [[1, 2], [2, 1], [1, 2], [2, 1]]
    # Megatron buckets only the first chunk of pipeline rank 0 (DistributedDataParallel.__init__:
    # no bucketing on later chunks and later pipeline ranks), as on GB200; there the scaled
    # bucket size gives several buckets. Their chain (next_param_gather_bucket_group) is built,
    # but at VP > 1 the schedule dispatches a chunk's gathers together (docs/gpu_settings.md);
    # the chain itself runs at VP 1 (tests/test_train_graph_gather.py)
    for r in (ranks[0], ranks[2]):
        assert r["chunks"][0]["buckets"] >= 2 and r["chunks"][0]["chained_gathers"] >= 1
