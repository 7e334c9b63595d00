"""`profile` under Slurm: `PROFILE=1 sbatch run_and_time.sh` runs `python -m llama31_405b profile`
on the ranks a run would get, with the same srun line (docs/profile.md, "Under Slurm").

- The launch lines (DRY_RUN, a 128-rack GB200 allocation faked in the environment, and the local
  torchrun line): fast, no cluster.
- One real job on the local Slurm cluster (tests/conftest_slurm.py): the tiny model as PP2 on two
  fake nodes (n1, n2; one rank each), one profiled step. The numerics of the analysis at 4 ranks
  and two layouts are tests/test_profile_run.py's (torchrun); this one checks what Slurm changes:
  ranks, hosts and rendezvous from Slurm's variables, every chosen rank's trace and host in the
  folder, the pipeline's point-to-point traffic between the two nodes attributed to the pipeline
  group, each step's components summing to the step, no MLPerf log.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest_slurm import REPO

GB200 = "configs/config_GB200_2048x4x8xtp4pp8cp2.toml"
SLURM_128_RACKS = dict(SLURM_JOB_ID="77", SLURM_JOB_NUM_NODES="2048",
                       SLURM_JOB_NODELIST="gb-r[001-128]-n[01-16]", SLURM_CPUS_ON_NODE="144",
                       SLURM_GPUS_ON_NODE="4", SLURM_SUBMIT_DIR=str(REPO))


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "CONT", "NEXP", "PROFILE", "SEED_BASE"))}
    env.update(PYTHONPATH=str(REPO), PYTHON=sys.executable, **extra)
    return env


def _script(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "run_and_time.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def _printed(p) -> list[str]:
    """The commands DRY_RUN printed, without printf %q's backslashes."""
    return [re.sub(r"\\([,\[\]])", r"\1", ln) for ln in p.stderr.splitlines()
            if ln.startswith("+ ")]


def test_profile_job_srun_line_is_the_runs(tmp_path):
    """On a 128-rack allocation with a container: the profile step is the timed run's srun line
    (every rank, the cores per rank, kill on a bad exit, the container with the config's
    environment) running `profile` into /logs with the first run's seed and PROFILE_ARGS; the
    pre-flight and data verification stay; no train, no cache dropping, no compliance check."""
    env = _env(CONFIG=GB200, DRY_RUN="1", SEED_BASE="40", CONT="reg/llama31:1", PROFILE="1",
               PROFILE_ARGS="--steps 2 --ranks 0,5,17", DATADIR="/lustre/data",
               CKPTDIR="/lustre/ckpt", LOGDIR=str(tmp_path), **SLURM_128_RACKS)
    p = _script(env)
    assert p.returncode == 0, p.stderr
    lines = _printed(p)
    prof = [ln for ln in lines if " llama31_405b profile " in ln]
    assert len(prof) == 1, lines
    assert prof[0].startswith("+ srun --nodes=2048 --ntasks=8192 --ntasks-per-node=4 "
                              "--cpus-per-task=36 --kill-on-bad-exit=1 --container-image=reg/llama31:1 ")
    assert f"--container-mounts=/lustre/ckpt:/ckpt,/lustre/data:/data,{tmp_path}:/logs " in prof[0]
    assert "--container-env=MASTER_ADDR," in prof[0]
    assert prof[0].endswith(f"python -m llama31_405b profile {GB200} --set data.data_dir=/data "
                            "--set checkpoint.ckpt_dir=/ckpt --out /logs --seed 40 --steps 2 "
                            "--ranks 0,5,17")
    assert any(" launch preflight " in ln for ln in lines)
    assert any(" data verify " in ln for ln in lines)
    assert not any(" train " in ln or "bash -c" in ln or "check-log" in ln for ln in lines), lines
    assert "runs with seeds 40," in p.stderr and "not an MLPerf run" in p.stderr


def test_profile_local_line_and_bad_variables(tmp_path):
    p = _script(_env(CONFIG="configs/tiny_cpu_2racks.toml", DRY_RUN="1", PROFILE="1",
                     LOGDIR=str(tmp_path), VERIFY_DATA="0"))
    assert p.returncode == 0, p.stderr
    assert _printed(p) == [f"+ {sys.executable} -m torch.distributed.run --standalone "
                           "--nproc-per-node=4 -m llama31_405b profile "
                           f"configs/tiny_cpu_2racks.toml --out {tmp_path} --seed 1"]
    p = _script(_env(CONFIG="configs/tiny_cpu.toml", PROFILE="yes", LOGDIR=str(tmp_path)))
    assert p.returncode == 2 and "PROFILE=yes: set PROFILE=1" in p.stderr
    p = _script(_env(CONFIG="configs/tiny_cpu.toml", PROFILE_ARGS="--steps 1",
                     LOGDIR=str(tmp_path)))
    assert p.returncode == 2 and "PROFILE_ARGS is set but PROFILE is not 1" in p.stderr


# PP2 on one "rack" of two fake nodes (tiny_cpu_2racks' racks of two, one of them), 4 microbatches
ONE_RACK = "[system]\nracks = 1\n\n[batch]\nminibs = 8\nmicro_batch_size = 2\n"
NODES = ("n1", "n2")            # rack0 of the local cluster: the pipeline stays in one rack
# the fewest steps that exercise everything: one skipped, one timed (the overhead), one profiled
PROFILE_ARGS = "--skip 1 --baseline 1 --steps 1"


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.xdist_group("slurm")
def test_profile_job_on_two_nodes(slurm_cluster, tiny_env, tmp_path):
    cfg = tmp_path / "one_rack.toml"
    cfg.write_text(f'base = "{REPO / "configs" / "tiny_cpu_2racks.toml"}"\n\n{ONE_RACK}')
    out, job_out = tmp_path / "profile", tmp_path / "job.out"
    job = slurm_cluster.sbatch(
        ["--wait", "-N", "2", "-w", ",".join(NODES), "-o", str(job_out), "run_and_time.sh"],
        # no pre-flight, no data verification step (tests/test_slurm.py runs both; the profile
        # run still requires the recorded verification)
        env=slurm_cluster.env(CONFIG=str(cfg), PROFILE="1", PROFILE_ARGS=PROFILE_ARGS,
                              LOGDIR=str(out), PREFLIGHT="0", VERIFY_DATA="0",
                              DATADIR=str(tiny_env["data_dir"]),
                              CKPTDIR=str(tiny_env["ckpt_dir"])))
    job.communicate(timeout=600)
    text = job_out.read_text()
    assert job.returncode == 0, text[-5000:]
    assert f"profile done: {out}/analysis.txt" in text

    # every rank's record, with the fake node it ran on; both ranks are replica 0: both traced
    recs = {r: json.loads((out / "ranks" / f"rank{r:05d}.json").read_text()) for r in (0, 1)}
    assert [(recs[r]["host"], recs[r]["pp_rank"], recs[r]["profiled"]) for r in (0, 1)] == \
        [("n1", 0, True), ("n2", 1, True)]
    for r in (0, 1):
        assert (out / "traces" / f"rank{r:05d}.trace.json.gz").stat().st_size > 0

    res = json.loads((out / "analysis.json").read_text())
    assert res["mlperf_run"] is False and not res["unattributed"]
    assert sorted(res["ranks"]) == ["0", "1"]
    for rank, m in res["ranks"].items():
        assert m["host"] == NODES[int(rank)]
        # the stages' sends and receives between the nodes: the pipeline group megatron made
        meta = json.loads((out / "traces" / f"rank{int(rank):05d}.meta.json").read_text())
        pp = [g for g in m["comm"].values() if g["role"] == "PP"]
        assert len(pp) == 1 and pp[0]["ranks"] == meta["parallel_groups"]["PP"] == [0, 1], m["comm"]
        assert pp[0]["total_s"] > 0, pp
        # step = compute + exposed communication + host gaps, against the loop's own clock
        (wall,) = recs[int(rank)]["profiled_step_s"]
        (step,) = m["steps_detail"]
        assert abs(sum(step["components"].values()) - wall) <= 0.02 * wall, (rank, step, wall)

    analysis = (out / "analysis.txt").read_text()
    assert "PIPELINE_MODEL_PARALLEL_GROUP" in analysis and analysis in text
    # not an MLPerf run: marked, no MLPerf log line, no result file
    assert (out / "NOT_AN_MLPERF_RUN.txt").is_file()
    assert ":::MLLOG" not in text and '"run_start"' not in text
    assert not list(out.glob("result_*.txt"))
