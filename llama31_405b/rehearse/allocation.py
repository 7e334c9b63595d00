"""The Slurm allocation a rehearsal places its ranks on: hosts in the job's node order and the
rack (topology block or leaf switch) of each.

Default: a synthetic allocation of the config's nodes, whole racks in order (what
`sbatch --segment=<nodes per rack>` gives on Slurm >= 23.11 with topology/block), hosts named
`r<RACK>n<NODE>`. `--allocation FILE` reads another one: one `HOST RACK` pair per line, in the
order `scontrol show hostnames $SLURM_JOB_NODELIST` prints the job's nodes (`#` starts a
comment). Tasks are distributed as `srun --ntasks-per-node` does (block): rank r runs on node
r // gpus_per_node with local rank r % gpus_per_node.

Each rank's rack is found by the placement check's own `detect_rack` (parallel/placement.py):
`system.rack_of_host` when the config has it, else Slurm's SLURM_TOPOLOGY_ADDR, written here as
Slurm would for the host ("rehearsal.<rack>.<host>"). The driver's NVLink clique, which the real
check prefers on GB200, does not exist without the GPUs: the allocation's racks stand for it.
The collective part of the check (all_gather_object) is skipped: fake collectives move no data.
`placements` hands the table to `placement.evaluate`, the verdict every rank computes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..parallel.placement import Placement, PlacementError, detect_rack, evaluate, layout_of

TOPOLOGY_PATTERN = "switch.switch.node"


class AllocationError(ValueError):
    """An --allocation file that cannot be read; the message names file and line."""


@dataclass(frozen=True, slots=True)
class Allocation:
    hosts: tuple[str, ...]
    """Hosts in the job's node order."""
    racks: tuple[str, ...]
    """The topology block (rack) of each host, as Slurm reports it."""
    source: str
    """"synthetic" or the file it came from."""

    def describe(self) -> str:
        n_racks = len(dict.fromkeys(self.racks))
        return f"{len(self.hosts)} node(s) in {n_racks} rack(s) ({self.source})"


def synthetic(cfg) -> Allocation:
    """The config's nodes, whole racks in rack order."""
    d = cfg.derived
    per_node = d.system.gpus_per_node
    nodes_per_rack = max(1, d.gpus_per_rack // per_node)
    hosts, racks = [], []
    for node in range(d.nodes):
        rack, slot = divmod(node, nodes_per_rack)
        hosts.append(f"r{rack:03d}n{slot + 1:02d}")
        racks.append(f"rack{rack:03d}")
    return Allocation(tuple(hosts), tuple(racks), "synthetic")


def read_allocation(path: str | Path) -> Allocation:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise AllocationError(f"{path}: cannot read the allocation ({e.strerror})") from None
    hosts, racks = [], []
    for no, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2:
            raise AllocationError(f"{path}:{no}: expected 'HOST RACK', got {line.strip()!r}")
        if "." in words[1]:
            raise AllocationError(f"{path}:{no}: rack name {words[1]!r} contains '.' (Slurm's "
                                  "topology address separator); rename it")
        hosts.append(words[0])
        racks.append(words[1])
    if len(set(hosts)) != len(hosts):
        dup = next(h for h in hosts if hosts.count(h) > 1)
        raise AllocationError(f"{path}: host {dup} is listed twice")
    if not hosts:
        raise AllocationError(f"{path}: no 'HOST RACK' lines")
    return Allocation(tuple(hosts), tuple(racks), str(path))


def host_of_rank(cfg, alloc: Allocation, rank: int) -> str:
    return alloc.hosts[rank // cfg.derived.system.gpus_per_node]


def placements(cfg, alloc: Allocation) -> list[Placement]:
    """Every rank's Placement on `alloc`, as each rank's `local_placement` would find it from
    Slurm's topology (or system.rack_of_host). PlacementError when the allocation has too few
    nodes."""
    d = cfg.derived
    per_node = d.system.gpus_per_node
    if len(alloc.hosts) < d.nodes:
        raise PlacementError(f"the allocation ({alloc.describe()}) has fewer nodes than the "
                             f"{d.nodes} the config needs")
    out = []
    for rank in range(d.world_size):
        node = rank // per_node
        host, rack = alloc.hosts[node], alloc.racks[node]
        env = {"SLURM_TOPOLOGY_ADDR": f"rehearsal.{rack}.{host.split('.')[0]}",
               "SLURM_TOPOLOGY_ADDR_PATTERN": TOPOLOGY_PATTERN}
        found, source = detect_rack(host, cfg.system.rack_of_host, env, rank % per_node,
                                    fabric=lambda _local_rank: None)
        out.append(Placement(rank=rank, host=host, rack=found, source=source))
    return out


def check(cfg, alloc: Allocation) -> list[Placement]:
    """The placement check's verdict on `alloc` (PlacementError naming groups, ranks, hosts)."""
    return evaluate(layout_of(cfg), placements(cfg, alloc))
