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
    local_world_size: int = 0
    """Ranks on this machine (torchrun's LOCAL_WORLD_SIZE); 0 where the launcher does not say
    (Slurm binds its tasks to cores itself, srun --cpu-bind; processes started with RANK and
    WORLD_SIZE alone, as the tests' and first contact's are): nothing is then pinned."""


def _top_level_items(nodelist: str) -> list[str]:
    """"a[1-4,7],b2" -> ["a[1-4,7]", "b2"]: the commas outside brackets separate items."""
    items, depth = [], 0
    cur: list[str] = []
    for ch in nodelist:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    if depth != 0:
        raise ValueError(f"hostlist {nodelist!r}: unbalanced brackets")
    return [i.strip() for i in items if i.strip()]


def _bracket_values(spec: str, item: str) -> list[str]:
    """"01-03,7" -> ["01", "02", "03", "7"]: a range keeps the width of its lower bound."""
    out = []
    for part in spec.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"hostlist item {item!r}: bad range {part!r}")
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"hostlist item {item!r}: range {part!r} runs backwards")
        out += [f"{v:0{len(lo)}d}" for v in range(int(lo), int(hi) + 1)]
    return out


def _expand_item(item: str) -> list[str]:
    """"gb-r[1-2]-n[01-02]" -> gb-r1-n01, gb-r1-n02, gb-r2-n01, gb-r2-n02 (last group fastest)."""
    hosts = [""]
    for text, spec in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
        values = _bracket_values(spec, item) if spec else [""]
        hosts = [h + text + v for h in hosts for v in values]
    return hosts


def expand_hostlist(nodelist: str) -> list[str]:
    """Every host of a Slurm hostlist expression, in the order `scontrol show hostnames` prints
    them: "n[1-3],m2" -> n1, n2, n3, m2. For places without Slurm's tools (containers, machines
    where Slurm is not installed); run_and_time.sh reaches it through `launch hostnames`."""
    return [h for item in _top_level_items(nodelist) for h in _expand_item(item)]


def compress_hostlist(hosts: list[str]) -> str:
    """A hostlist expression for `hosts` (as `scontrol show hostlist` makes one): hosts that
    differ only in their last number, of the same width, share brackets: n1,n2,n3,n7 -> n[1-3,7].
    Groups keep the order of their first host; numbers within a group are sorted."""
    parsed = [re.fullmatch(r"(.*?)(\d+)(\D*)", h) for h in hosts]
    padded = {(m[1], m[3], len(m[2])) for m in parsed if m and len(m[2]) > 1 and m[2][0] == "0"}
    groups: dict[tuple[str, int, str], list[int]] = {}
    for h, m in zip(hosts, parsed):
        if not m:
            groups.setdefault((h, -1, ""), [])
            continue
        prefix, num, suffix = m.groups()
        # zero-padded numbers keep their width; "10" joins a group of "01".."09" of width 2
        width = len(num) if (prefix, suffix, len(num)) in padded else 0
        groups.setdefault((prefix, width, suffix), []).append(int(num))
    out = []
    for (prefix, width, suffix), nums in groups.items():
        if width < 0:
            out.append(prefix)
            continue
        nums = sorted(set(nums))
        fmt = (lambda v: f"{v:0{width}d}") if width else str
        if len(nums) == 1:
            out.append(f"{prefix}{fmt(nums[0])}{suffix}")
            continue
        runs, start = [], nums[0]
        for a, b in zip(nums, nums[1:] + [None]):
            if b != a + 1:
                runs.append(fmt(start) if start == a else f"{fmt(start)}-{fmt(a)}")
                if b is not None:
                    start = b
        out.append(f"{prefix}[{','.join(runs)}]{suffix}")
    return ",".join(out)


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist expression, as `scontrol show hostnames` would print it:
    the first value of every bracket group of the first item ("gb-r[01-08]-n[01-16]" ->
    "gb-r01-n01")."""
    return _expand_item(_top_level_items(nodelist)[0])[0]


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
                       launcher="torchrun",
                       local_world_size=int(env.get("LOCAL_WORLD_SIZE", 0)))
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
