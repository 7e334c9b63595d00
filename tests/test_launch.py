"""The launcher without a cluster: the launch plan, --set overrides, run_and_time.sh's commands
(DRY_RUN, with a Slurm allocation faked in the environment). The per-log verdict: test_check_log.py."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llama31_405b.config import ConfigError, launch_env, load_config
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


@pytest.fixture(scope="module")
def path_without_scontrol(tmp_path_factory) -> str:
    """A PATH with every command of this one except Slurm's `scontrol` (a machine where Slurm was
    never installed, or a container): one folder of links to the first of each name."""
    bin_dir = tmp_path_factory.mktemp("no_scontrol_bin")
    for d in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            src, dst = os.path.join(d, name), bin_dir / name
            if name != "scontrol" and not dst.exists() and os.access(src, os.X_OK) \
                    and os.path.isfile(src):
                dst.symlink_to(src)
    assert shutil.which("scontrol", path=str(bin_dir)) is None
    return str(bin_dir)


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


# Each Slurm launch runs twice: with the host's commands, and with no `scontrol` on PATH (the
# script then expands the job's hostlist with `launch hostnames`, the project's own expansion).
NO_SCONTROL = pytest.mark.parametrize("hide_scontrol", [False, True], ids=["path", "no-scontrol"])


def _slurm_env(hide_scontrol: bool, path: str, **kw) -> dict:
    env = _env(**kw)
    if hide_scontrol:
        env["PATH"] = path
    return env


@NO_SCONTROL
def test_script_on_slurm_with_container_dry_run(tmp_path, hide_scontrol, path_without_scontrol):
    env = _slurm_env(hide_scontrol, path_without_scontrol, CONFIG=GB200, DRY_RUN="1", NEXP="2",
                     SEED_BASE="40", CONT="reg/llama31:1", DATADIR="/lustre/data",
                     CKPTDIR="/lustre/ckpt", LOGDIR=str(tmp_path), **SLURM_128_RACKS)
    p = _script(env)
    assert p.returncode == 0, p.stderr
    lines = _srun_lines(p)
    preflight, run0, run1 = [ln for ln in lines if "--ntasks=8192" in ln]
    names = ",".join(["MASTER_ADDR", *sorted(launch_env(load_config(REPO / GB200)))])
    cont = (f"--container-image=reg/llama31:1 --container-name=llama31_405b "
            f"--container-mounts=/lustre/ckpt:/ckpt,/lustre/data:/data,{tmp_path}:/logs "
            f"--container-workdir=/workspace/llama31_405b --container-writable "
            f"--container-remap-root --no-container-mount-home --container-env={names}")
    assert "NCCL_MIN_NCHANNELS" in names and "TRITON_CACHE_DIR" in names
    # one task per GPU, each with a quarter of the node's cores (not Slurm's default of 1 CPU)
    assert ("--nodes=2048 --ntasks=8192 --ntasks-per-node=4 --cpus-per-task=36 "
            + cont) in preflight
    assert "launch preflight --config " + GB200 + " --timeout 600" in preflight
    assert "--cpus-per-task=36 --kill-on-bad-exit=1 " + cont in run0
    assert "--nodelist" not in run0                      # the job has exactly the nodes it needs
    assert "MASTER_ADDR" not in p.stdout and "note: the job requested no GPUs" not in p.stderr
    assert run0.endswith(f"python -m llama31_405b train --config {GB200} --set data.data_dir=/data "
                         "--set checkpoint.ckpt_dir=/ckpt --seed 40 --mlperf-log /logs/result_0.txt")
    assert "--seed 41 --mlperf-log /logs/result_1.txt" in run1
    # the data is verified once, in the container, after the pre-flight and before the first run
    verify = [ln for ln in lines if " data verify " in ln]
    assert verify == [f"+ srun --nodes=1 --ntasks=1 {cont} python -m llama31_405b data verify "
                      f"{GB200} --set data.data_dir=/data --set checkpoint.ckpt_dir=/ckpt"], lines
    assert lines.index(preflight) < lines.index(verify[0]) < lines.index(run0)
    # cache clearing: one task per node before each run
    assert sum("--ntasks=2048 --ntasks-per-node=1 bash -c" in ln
               for ln in lines) == 2, lines


@NO_SCONTROL
def test_script_uses_the_first_nodes_of_a_larger_job(tmp_path, hide_scontrol,
                                                     path_without_scontrol):
    """Spare nodes: every step gets the same explicit --nodelist (its first node = MASTER_ADDR);
    without a container the launch_env is exported to the steps as is."""
    env = _slurm_env(hide_scontrol, path_without_scontrol, CONFIG="configs/tiny_cpu_2racks.toml",
                     DRY_RUN="1", NEXP="1", LOGDIR=str(tmp_path), SLURM_JOB_ID="9",
                     SLURM_JOB_NUM_NODES="6", SLURM_JOB_NODELIST="n[1-6]",
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


@NO_SCONTROL
def test_script_master_addr_is_the_first_node(tmp_path, hide_scontrol, path_without_scontrol):
    out = tmp_path / "env.txt"
    env = _slurm_env(hide_scontrol, path_without_scontrol, CONFIG="configs/tiny_cpu_2racks.toml",
                     NEXP="1", LOGDIR=str(tmp_path), SLURM_JOB_ID="9", SLURM_JOB_NUM_NODES="4",
                     SLURM_JOB_NODELIST="gb-r[07-08]-n[15-16]", SLURM_SUBMIT_DIR=str(REPO),
                     PREFLIGHT="0", VERIFY_DATA="0", CLEAR_CACHES="0",
                     DATADIR=str(tmp_path / "data"), CKPTDIR=str(tmp_path))
    (tmp_path / "data" / "tokenizer").mkdir(parents=True)   # the folders the job checks first
    (tmp_path / "data" / "tokenizer" / "tiny_sp.model").write_bytes(b"x")
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
    assert (f"+ {sys.executable} -m llama31_405b data verify configs/tiny_cpu.toml "
            f"--set data.data_dir=/x\n") in p.stderr
    assert p.stderr.index(" data verify ") < p.stderr.index(" train --config ")


def test_script_stops_before_any_run_when_the_data_does_not_verify(tmp_path):
    """The data verification step fails the job (exit 1) with a message naming the fix, before
    any run starts; VERIFY_DATA=0 skips it."""
    empty = tmp_path / "no_data"     # the tokenizer alone: the folder check passes
    (empty / "tokenizer").mkdir(parents=True)
    (empty / "tokenizer" / "tiny_sp.model").write_bytes(b"x")
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(f'base = "{REPO / "configs" / "tiny_cpu.toml"}"\n[data]\ndata_dir = "{empty}"\n')
    logs = tmp_path / "logs"
    p = _script(_env(CONFIG=str(cfg), NEXP="1", LOGDIR=str(logs), CLEAR_CACHES="0",
                     CKPTDIR=str(tmp_path)))
    assert p.returncode == 1, p.stderr
    assert "FAILED: data verification exited" in p.stderr and "no run was started" in p.stderr
    assert "run 0:" not in p.stderr and not (logs / "result_0.txt").exists()
    p = _script(_env(CONFIG=str(cfg), NEXP="1", LOGDIR=str(logs), DRY_RUN="1", VERIFY_DATA="0"))
    assert p.returncode == 0 and " data verify " not in p.stderr


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


@pytest.mark.parametrize("nodelist,hosts,compressed", [
    ("node07", ["node07"], "node07"),
    ("n[1-4]", ["n1", "n2", "n3", "n4"], "n[1-4]"),
    ("n[3,5-7],m2", ["n3", "n5", "n6", "n7", "m2"], "n[3,5-7],m2"),
    ("n[8-11]", ["n8", "n9", "n10", "n11"], "n[8-11]"),
    ("gpu-[0099-0101]", ["gpu-0099", "gpu-0100", "gpu-0101"], "gpu-[0099-0101]"),
    ("gb-r[07-08]-n[15-16]", ["gb-r07-n15", "gb-r07-n16", "gb-r08-n15", "gb-r08-n16"],
     "gb-r07-n[15-16],gb-r08-n[15-16]"),
    ("login,c[1-2]", ["login", "c1", "c2"], "login,c[1-2]")])
def test_hostlists_without_scontrol(nodelist, hosts, compressed):
    """What `scontrol show hostnames` / `show hostlist` give, for run_and_time.sh where Slurm's
    tools are missing: every host in order (the last bracket varies fastest, a range keeps the
    width of its lower bound), and an expression that expands back to the same hosts."""
    from llama31_405b.parallel.distributed import compress_hostlist, expand_hostlist
    assert expand_hostlist(nodelist) == hosts
    assert compress_hostlist(hosts) == compressed
    assert expand_hostlist(compressed) == hosts


def test_hostlist_commands(tmp_path):
    big = subprocess.run([sys.executable, "-m", "llama31_405b", "launch", "hostnames", NODELIST],
                         cwd=REPO, env=_env(), capture_output=True, text=True, check=True)
    hosts = big.stdout.split()
    assert len(hosts) == 2048 and hosts[:2] == ["gb-r001-n01", "gb-r001-n02"]
    assert hosts[-1] == "gb-r128-n16" and len(set(hosts)) == 2048
    back = subprocess.run([sys.executable, "-m", "llama31_405b", "launch", "hostlist",
                           ",".join(hosts[:32])], cwd=REPO, env=_env(), capture_output=True,
                          text=True, check=True)
    assert back.stdout.strip() == "gb-r001-n[01-16],gb-r002-n[01-16]"
    bad = subprocess.run([sys.executable, "-m", "llama31_405b", "launch", "hostnames", "n[1-"],
                         cwd=REPO, env=_env(), capture_output=True, text=True)
    assert bad.returncode == 2 and "unbalanced brackets" in bad.stderr


@pytest.mark.parametrize("nodelist,first", [
    ("node07", "node07"), ("n[1-4]", "n1"), ("n[3,5-9],m2", "n3"), ("gpu-[0012-0020,0031]", "gpu-0012"),
    ("gb-r[01-08]-n[01-16]", "gb-r01-n01"), ("a[2-3]b[7,9],c1", "a2b7")])
def test_first_host_of_a_slurm_hostlist_without_scontrol(nodelist, first):
    """The rendezvous host when scontrol is missing (inside a container): what `scontrol show
    hostnames` prints first."""
    from llama31_405b.parallel.distributed import first_host
    assert first_host(nodelist) == first
