"""Where this process sits in the job: rank layout from torchrun or Slurm, and process-group init.

torchrun sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT; a Slurm step (one task per GPU)
sets SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID and the node list. A single process with neither is
rank 0 of 1. This module is the one place that reads those variables.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True, slots=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    hostname: str
    launcher: str
    """"torchrun", "slurm" or "single"."""


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist expression, as `scontrol show hostnames` would print it:
    the first top-level item ("a[1-4,7],b2" -> "a[1-4,7]") with every bracket group replaced by
    its first value ("gb-r[01-08]-n[01-16]" -> "gb-r01-n01")."""
    depth, item = 0, []
    for ch in nodelist:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            break
        item.append(ch)
    return re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0], "".join(item))


def _first_slurm_host(environ) -> str:
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        return "127.0.0.1"
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
        return out[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return first_host(nodelist)  # no scontrol (e.g. inside a container)


def _slurm_master_port(environ) -> int:
    """A port every task of one srun step derives alike: distinct for each step of a job (runs
    of run_and_time.sh follow each other, sockets may linger in TIME_WAIT), and kept below
    Linux's ephemeral range (32768+) so it does not collide with outgoing connections."""
    def num(name: str) -> int:
        value = environ.get(name, "")
        return int(value) if value.isdigit() else 0
    return 20000 + (num("SLURM_JOB_ID") * 64 + num("SLURM_STEP_ID")) % 12000


def dist_env_from_environ(environ=None) -> DistEnv:
    env = os.environ if environ is None else environ
    host = socket.gethostname()
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
                       local_rank=int(env.get("LOCAL_RANK", 0)),
                       master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                       master_port=int(env.get("MASTER_PORT", 29500)), hostname=host,
                       launcher="torchrun")
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return DistEnv(rank=int(env["SLURM_PROCID"]), world_size=int(env["SLURM_NTASKS"]),
                       local_rank=int(env.get("SLURM_LOCALID", 0)),
                       master_addr=env.get("MASTER_ADDR") or _first_slurm_host(env),
                       master_port=int(env.get("MASTER_PORT") or _slurm_master_port(env)),
                       hostname=host, launcher="slurm")
    return DistEnv(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1",
                   master_port=int(env.get("MASTER_PORT", 29500)), hostname=host, launcher="single")


def init_process_group(de: DistEnv, *, backend: str, timeout_s: float = 120.0) -> None:
    """Start torch.distributed for `de` (nccl on GPU, gloo on CPU). A short timeout turns a dead
    peer into an error instead of a hang."""
    import torch.distributed as dist
    if dist.is_initialized():
        return
    dist.init_process_group(backend=backend, init_method=f"tcp://{de.master_addr}:{de.master_port}",
                            rank=de.rank, world_size=de.world_size,
                            timeout=timedelta(seconds=timeout_s))
