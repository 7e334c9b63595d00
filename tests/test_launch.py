"""The launcher without a cluster: the launch plan, --set overrides, run_and_time.sh's commands
(DRY_RUN, with a Slurm allocation faked in the environment). The per-log verdict: test_check_log.py."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llama31_405b.config import ConfigError, load_config
from llama31_405b.config.overrides import parse_sets
from llama31_405b.launch import launch_plan, shell_assignments

REPO = Path(__file__).resolve().parents[1]
GB200 = "configs/config_GB200_2048x4x8xtp4pp8cp2.toml"


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CONT", "NEXP"))}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHON"] = sys.executable
    env.update(extra)
    return env


def test_parse_sets():
    assert parse_sets(["run.seed_base=7", "data.data_dir=/data", "system.rack_of_host={n1='a'}",
                       "precision.nvfp4_rht=true"]) == {
        "run": {"seed_base": 7}, "data": {"data_dir": "/data"},
        "system": {"rack_of_host": {"n1": "a"}}, "precision": {"nvfp4_rht": True}}
    with pytest.raises(ConfigError, match="expected section.key=value"):
        parse_sets(["seed_base"])


def test_plan_of_the_128_rack_config():
    plan = launch_plan(load_config(REPO / GB200), runs=2, seed_base=100)
    assert (plan.world_size, plan.nodes, plan.tasks_per_node, plan.nodes_per_rack) == (8192, 2048, 4, 16)
    assert plan.seeds == (100, 101) and plan.device == "gpu"
    assert "sbatch -N 2048" in plan.local_error and "--segment 16" in plan.local_error
    text = shell_assignments(plan)
    out = subprocess.run(["bash", "-c", text + 'echo "$LAUNCH_WORLD_SIZE ${LAUNCH_SEEDS[1]} '
                                               '$NVTE_NVFP4_DISABLE_RHT $CUDA_DEVICE_MAX_CONNECTIONS"'],
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == ["8192", "101", "1", "1"]


def test_plan_of_the_tiny_configs():
    two = launch_plan(load_config(REPO / "configs/tiny_cpu_2racks.toml"))
    assert (two.world_size, two.nodes, two.tasks_per_node, two.device) == (4, 4, 1, "cpu")
    assert two.local_error == "" and two.seeds == (1, 2, 3)


def _script(env: dict, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "run_and_time.sh")], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


# a 128-rack job as Slurm describes it to the batch script (GB200: 144 Grace cores per node)
NODELIST = "gb-r[001-128]-n[01-16]"
SLURM_128_RACKS = dict(SLURM_JOB_ID="77", SLURM_JOB_NUM_NODES="2048", SLURM_JOB_NODELIST=NODELIST,
                       SLURM_CPUS_ON_NODE="144", SLURM_GPUS_ON_NODE="4",
                       SLURM_SUBMIT_DIR=str(REPO))


def _srun_lines(p) -> list[str]:
    """The srun lines DRY_RUN printed, without printf %q's backslashes."""
    return [re.sub(r"\\([,\[\]])", r"\1", ln) for ln in p.stderr.splitlines()
            if ln.startswith("+ srun")]


def test_script_on_slurm_with_container_dry_run(tmp_path):
    env = _env(CONFIG=GB200, DRY_RUN="1", NEXP="2", SEED_BASE="40", CONT="reg/llama31:1",
               DATADIR="/lustre/data", CKPTDIR="/lustre/ckpt", LOGDIR=str(tmp_path),
               **SLURM_128_RACKS)
    p = _script(env)
    assert p.returncode == 0, p.stderr
    lines = _srun_lines(p)
    preflight, run0, run1 = [ln for ln in lines if "--ntasks=8192" in ln]
    cont = (f"--container-image=reg/llama31:1 --container-name=llama31_405b "
            f"--container-mounts=/lustre/ckpt:/ckpt,/lustre/data:/data,{tmp_path}:/logs "
            f"--container-workdir=/workspace/llama31_405b --no-container-mount-home "
            f"--container-env=MASTER_ADDR,CUDA_DEVICE_MAX_CONNECTIONS,NCCL_NVLS_ENABLE,"
            f"NVTE_DPA_FP8_RECIPE,NVTE_NVFP4_DISABLE_2D_QUANTIZATION,NVTE_NVFP4_DISABLE_RHT,"
            f"NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING")
    # one task per GPU, each with a quarter of the node's cores (not Slurm's default of 1 CPU)
    assert ("--nodes=2048 --ntasks=8192 --ntasks-per-node=4 --cpus-per-task=36 "
            "--export=ALL,TORCH_GLOO_LAZY_INIT=1 " + cont) in preflight
    assert "launch preflight --config " + GB200 + " --timeout 600" in preflight
    assert "--cpus-per-task=36 --kill-on-bad-exit=1 " + cont in run0
    assert "--nodelist" not in run0                      # the job has exactly the nodes it needs
    assert "MASTER_ADDR" not in p.stdout and "note: the job requested no GPUs" not in p.stderr
    assert run0.endswith(f"python -m llama31_405b train --config {GB200} --set data.data_dir=/data "
                         "--set checkpoint.ckpt_dir=/ckpt --seed 40 --mlperf-log /logs/result_0.txt")
    assert "--seed 41 --mlperf-log /logs/result_1.txt" in run1
    # cache clearing: one task per node before each run
    assert sum("--ntasks=2048 --ntasks-per-node=1 bash -c" in ln
               for ln in lines) == 2, lines


def test_script_uses_the_first_nodes_of_a_larger_job(tmp_path):
    """Spare nodes: every step gets the same explicit --nodelist (its first node = MASTER_ADDR);
    without a container the launch_env is exported to the steps as is."""
    env = _env(CONFIG="configs/tiny_cpu_2racks.toml", DRY_RUN="1", NEXP="1", LOGDIR=str(tmp_path),
               SLURM_JOB_ID="9", SLURM_JOB_NUM_NODES="6", SLURM_JOB_NODELIST="n[1-6]",
               SLURM_CPUS_ON_NODE="2", SLURM_SUBMIT_DIR=str(REPO))
    p = _script(env)
    assert p.returncode == 0, p.stderr
    assert "the job has 6 nodes, the runs use the first 4" in p.stderr
    multi = [ln for ln in _srun_lines(p) if "--nodes=4" in ln]
    assert len(multi) == 3 and all("--nodelist=n[1-4]" in ln for ln in multi)
    preflight, drop, train = multi
    assert "--ntasks-per-node=1 --nodelist=n[1-4] bash -c" in drop
    assert "--nodelist=n[1-4] --cpus-per-task=2 " in preflight and "preflight" in preflight
    assert "--nodelist=n[1-4] --cpus-per-task=2 --kill-on-bad-exit=1" in train
    assert not any("--container" in ln for ln in multi)


def test_script_master_addr_is_the_first_node(tmp_path):
    out = tmp_path / "env.txt"
    env = _env(CONFIG="configs/tiny_cpu_2racks.toml", NEXP="1", LOGDIR=str(tmp_path),
               SLURM_JOB_ID="9", SLURM_JOB_NUM_NODES="4", SLURM_JOB_NODELIST="gb-r[07-08]-n[15-16]",
               SLURM_SUBMIT_DIR=str(REPO), PREFLIGHT="0", CLEAR_CACHES="0")
    # a fake srun on PATH records what the training step would see
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text(f'#!/bin/bash\necho "$MASTER_ADDR $*" >> {out}\nexit 1\n')
    (fake / "srun").chmod(0o755)
    env["PATH"] = f"{fake}:{env['PATH']}"
    p = _script(env)
    # the fake step failed and wrote no log: no success, and no run_stop (exit 4)
    assert p.returncode == 4 and "FAILED" in p.stderr
    first = out.read_text().splitlines()[0]
    assert first.startswith("gb-r07-n15 --nodes=4 --ntasks=4"), first


def test_script_rejects_too_few_nodes_and_missing_config(tmp_path):
    p = _script(_env(CONFIG="configs/tiny_cpu_2racks.toml", LOGDIR=str(tmp_path),
                     SLURM_JOB_ID="5", SLURM_JOB_NUM_NODES="2", SLURM_SUBMIT_DIR=str(REPO)))
    assert p.returncode == 2
    assert "the job has 2 node(s), configs/tiny_cpu_2racks.toml needs 4: sbatch -N 4" in p.stderr
    p = _script(_env(LOGDIR=str(tmp_path)))
    assert p.returncode == 2 and "set CONFIG=" in p.stderr
    p = _script(_env(CONFIG=GB200, LOGDIR=str(tmp_path)))
    assert p.returncode == 2 and "needs 2048 nodes x 4 GPUs" in p.stderr


def test_script_local_commands(tmp_path):
    p = _script(_env(CONFIG="configs/tiny_cpu_2racks.toml", DRY_RUN="1", NEXP="1",
                     LOGDIR=str(tmp_path)))
    assert p.returncode == 0, p.stderr
    assert (f"-m torch.distributed.run --standalone --nproc-per-node=4 -m llama31_405b train "
            f"--config configs/tiny_cpu_2racks.toml --seed 1 --mlperf-log {tmp_path}/result_0.txt") in p.stderr
    p = _script(_env(CONFIG="configs/tiny_cpu.toml", DRY_RUN="1", NEXP="1", LOGDIR=str(tmp_path),
                     DATADIR="/x"))
    assert (f"{sys.executable} -m llama31_405b train --config configs/tiny_cpu.toml "
            f"--set data.data_dir=/x --seed 1") in p.stderr


def test_config_names_match_their_launch_plan():
    """config_<SYSTEM>_<NODES>x<GPUS_PER_NODE>x<MINIBS>xtp<T>pp<P>cp<C>: the sbatch -N of the docs
    comes from the name, the srun layout from the plan; they must agree."""
    pattern = re.compile(r"config_\w+?_(\d+)x(\d+)x(\d+)xtp(\d+)pp(\d+)cp(\d+)\.toml")
    checked = 0
    for path in sorted((REPO / "configs").glob("config_*.toml")):
        m = pattern.fullmatch(path.name)
        assert m, f"{path.name} does not follow the MLPerf config naming"
        nodes, gpn, minibs, tp, pp, cp = map(int, m.groups())
        cfg = load_config(path)
        plan = launch_plan(cfg)
        assert (plan.nodes, plan.tasks_per_node, cfg.batch.minibs) == (nodes, gpn, minibs), path.name
        assert (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.cp) == (tp, pp, cp), path.name
        assert plan.world_size == nodes * gpn
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize("nodelist,first", [
    ("node07", "node07"), ("n[1-4]", "n1"), ("n[3,5-9],m2", "n3"), ("gpu-[0012-0020,0031]", "gpu-0012"),
    ("gb-r[01-08]-n[01-16]", "gb-r01-n01"), ("a[2-3]b[7,9],c1", "a2b7")])
def test_first_host_of_a_slurm_hostlist_without_scontrol(nodelist, first):
    """The rendezvous host when scontrol is missing (inside a container): what `scontrol show
    hostnames` prints first."""
    from llama31_405b.parallel.distributed import first_host
    assert first_host(nodelist) == first
