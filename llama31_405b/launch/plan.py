"""The launch plan of a config: every number run_and_time.sh uses, computed here and printed as
shell assignments, so the batch script holds no arithmetic of its own.

`python -m llama31_405b launch env CONFIG` prints, e.g. for configs/tiny_cpu_2racks.toml:

    LAUNCH_BENCHMARK=tiny_llama31
    LAUNCH_WORLD_SIZE=4
    LAUNCH_NODES=4
    LAUNCH_TASKS_PER_NODE=1
    LAUNCH_NODES_PER_RACK=2
    LAUNCH_DEVICE=cpu
    LAUNCH_SEEDS=(1 2 3)
    LAUNCH_LOCAL_ERROR=''
    LAUNCH_DIRS_ERROR=''

followed by `export NAME=value` for each variable of `config.env.launch_env` and
`LAUNCH_ENV_NAMES=(...)`, their names. The tiny config fixes `run.seed_base = 1`; a config
without it (the GB200 configs) gets fresh seeds from the system's entropy at every call.
LAUNCH_DIRS_ERROR is the first unreadable folder or file the job needs (`dirs.check_job_dirs`,
with `launch env --check-dirs`; '' when all are readable or unchecked).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..config.env import launch_env
from ..config.paths import shipped_file
from ..config.schema import Config
from ..config.seeds import run_seeds


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    config: str
    benchmark: str
    world_size: int
    nodes: int
    tasks_per_node: int
    """Tasks (ranks) per node: one per GPU; one per (fake) node slot for CPU systems."""
    nodes_per_rack: int
    """Nodes Slurm should keep together, the `sbatch --segment` value on Slurm >= 23.11
    (`Derived.segment_nodes`): one NVLink domain where it spans nodes (16 on GB200 NVL72), else
    the nodes of one model-parallel group (8 for TP4-PP8-CP2 on 8-GPU nodes)."""
    device: str
    """"gpu" or "cpu"."""
    seeds: tuple[int, ...]
    """Seed of run i = seed_base + i, or drawn from the system's entropy (config.seeds)."""
    local_error: str
    """Why the config cannot run on this one machine without Slurm ("" when it can)."""
    env: dict[str, str]
    dirs_error: str = ""
    """The first folder or file the job needs and cannot read (launch.dirs; "" when none or
    unchecked): run_and_time.sh stops on it before any run."""


def launch_plan(cfg: Config, *, runs: int | None = None, seed_base: int | None = None,
                check_dirs: bool = False) -> LaunchPlan:
    """check_dirs: check the data folder, tokenizer and checkpoint folder (launch.dirs) on this
    machine, into `dirs_error`."""
    from .dirs import check_job_dirs
    d = cfg.derived
    if cfg.performance.nccl_communicator_config:   # a missing file fails here, not at init
        shipped_file(cfg.performance.nccl_communicator_config,
                     key="performance.nccl_communicator_config")
    n = cfg.run.num_runs if runs is None else runs
    seeds = run_seeds(cfg.run.seed_base if seed_base is None else seed_base, n)
    gpu = d.system.is_gpu
    tasks = min(d.system.gpus_per_node, d.world_size)
    per_rack = d.segment_nodes
    what = ("one model-parallel group" if d.system.node_nvlink_domain
            else "one NVLink domain")
    local_error = ""
    if gpu and d.nodes > 1:
        local_error = (f"{cfg.source or 'this config'} needs {d.nodes} nodes x {tasks} GPUs; "
                       f"submit it with: CONFIG={cfg.source} sbatch -N {d.nodes} run_and_time.sh "
                       f"(Slurm >= 23.11 with topology/block: add --segment {per_rack}, the nodes "
                       f"of {what})")
    return LaunchPlan(config=cfg.source, benchmark=cfg.run.benchmark, world_size=d.world_size,
                      nodes=d.nodes, tasks_per_node=tasks, nodes_per_rack=per_rack, device="gpu" if gpu else "cpu",
                      seeds=seeds, local_error=local_error,
                      env=launch_env(cfg), dirs_error=check_job_dirs(cfg) if check_dirs else "")


def shell_assignments(plan: LaunchPlan) -> str:
    """Bash assignments for `eval`; every value shell-quoted."""
    q = shlex.quote
    lines = [
        f"LAUNCH_CONFIG={q(plan.config)}",
        f"LAUNCH_BENCHMARK={q(plan.benchmark)}",
        f"LAUNCH_WORLD_SIZE={plan.world_size}",
        f"LAUNCH_NODES={plan.nodes}",
        f"LAUNCH_TASKS_PER_NODE={plan.tasks_per_node}",
        f"LAUNCH_NODES_PER_RACK={plan.nodes_per_rack}",
        f"LAUNCH_DEVICE={plan.device}",
        f"LAUNCH_SEEDS=({' '.join(str(s) for s in plan.seeds)})",
        f"LAUNCH_LOCAL_ERROR={q(plan.local_error)}",
        f"LAUNCH_DIRS_ERROR={q(plan.dirs_error)}",
    ]
    for name, value in sorted(plan.env.items()):
        if not name.isidentifier():
            raise ValueError(f"launch_env name {name!r} is not a valid environment variable name")
        lines.append(f"export {name}={q(value)}")
    # the names again, for pyxis --container-env: without it an image's own value of a variable
    # (NGC images set some) would silently win over the config's
    lines.append(f"LAUNCH_ENV_NAMES=({' '.join(sorted(plan.env))})")
    return "\n".join(lines) + "\n"
