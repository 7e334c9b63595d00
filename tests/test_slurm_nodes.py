"""The placement check of 8-GPU systems on a real Slurm cluster: the project's local cluster
(scripts/local_slurm_cluster.sh: 4 fake nodes n1-n4 under two leaf switches, rack0 = n1,n2 and
rack1 = n3,n4; started once per session by conftest_slurm) with each fake node running 8 ranks,
its "GPUs" (`srun -N 2 -n 16 --overcommit`: block distribution puts ranks 0-7 on the first node;
the fake nodes declare 2 CPUs each, and Slurm 22.05 refuses `--ntasks-per-node=8` above a
node's CPU count even with --overcommit: "Requested node configuration is not available").

The config is the tiny model as TP2-PP8 on the `cpu-node8` system (8 ranks per node, the NVLink
domain is the node): 16 ranks on 2 nodes, the TP pairs inside a node and the pipeline across
both. `launch preflight` is the placement step run_and_time.sh runs before any run.
The same logic without Slurm: tests/test_placement_nodes.py.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest_slurm import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm")]

SETS = ["system.id=cpu-node8", "system.racks=2", "system.gpus_per_rack=8", "parallel.tp=2",
        "parallel.pp=8", "model.num_layers=8", "batch.micro_batch_size=1"]


def preflight(cluster, *srun_args: str) -> subprocess.CompletedProcess:
    cmd = ["srun", "-N", "2", "-n", "16", "--overcommit", "--kill-on-bad-exit=1",
           *srun_args, sys.executable, "-m", "llama31_405b", "launch", "preflight",
           "--config", "configs/tiny_cpu.toml", "--timeout", "240"]
    for s in SETS:
        cmd += ["--set", s]
    return subprocess.run(cmd, cwd=REPO, env=cluster.env(), capture_output=True, text=True,
                          timeout=600)


def test_tp_inside_a_node_and_pp_across_nodes_pass(slurm_cluster):
    p = preflight(slurm_cluster, "--nodelist=n1,n2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "preflight ok: 16 rank(s) via slurm" in p.stdout
    assert "placement: 2 node(s), world 16, TP2 CP1 PP8 DP1; NVLink domain = node" in p.stderr
    assert "DP rank 0: global ranks 0-15, 2 node(s): n1, n2; leaf switch(es) rack0" in p.stderr
    assert "warning:" not in p.stderr


def test_a_pipeline_over_two_leaf_switches_passes_with_a_warning(slurm_cluster):
    p = preflight(slurm_cluster, "--nodelist=n2,n3")        # n2 under rack0, n3 under rack1
    assert p.returncode == 0, p.stdout + p.stderr
    assert "warning: 1 of 1 model-parallel groups (pipelines) span leaf switches" in p.stderr
    assert "switch rack0: n2; switch rack1: n3" in p.stderr
    assert "Expected cost: each crossing hop sends" in p.stderr


def test_a_tp_group_split_over_two_nodes_stops_the_job(slurm_cluster):
    p = preflight(slurm_cluster, "--nodelist=n1,n2", "--distribution=cyclic")
    text = p.stdout + p.stderr
    # srun returns the highest task status: the ranks that fail the check exit 3, and those
    # --kill-on-bad-exit terminates before they get there report 143 (SIGTERM)
    assert p.returncode in (3, 143), text
    assert "Exited with exit code 3" in text
    assert "placement check failed: TP groups (and CP groups while TP x CP <= 8) must stay " \
           "inside one node" in text
    assert "TP group ranks 0-1 spans nodes: node n1 (rank 0); node n2 (rank 1)" in text
    assert text.count("placement check failed") == 1            # one message, not one per rank
