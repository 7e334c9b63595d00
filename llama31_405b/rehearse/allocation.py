"""The Slurm allocation a rehearsal places its ranks on, and the placement check run on it.

Default: a synthetic allocation of the config's nodes, whole racks in order (what
`sbatch --segment=<nodes per rack>` gives on Slurm >= 23.11 with topology/block), hosts named
`r<RACK>n<NODE>`. `--allocation FILE` reads another one: one `HOST RACK` pair per line, in the
order `scontrol show hostnames $SLURM_JOB_NODELIST` prints the job's nodes (`#` starts a
comment). Tasks are distributed as `srun --ntasks-per-node` does (block): rank r runs on node
r // gpus_per_node with local rank r % gpus_per_node.

The check is the project's own `placement.check_placement`, for each rank as that rank would
run it. What a rank reads from its node is synthesised from the allocation:
- the environment: the config's launch_env (what run_and_time.sh exports) and Slurm's topology
  address, "rehearsal.<rack>.<host>";
- the NVLink fabric (GB200: `nvidia-smi -q` and the IMEX channels): every GPU registered,
  Completed/Success, in the clique of its rack, and one IMEX channel.
`local_placement` turns that into each rank's Placement (`report`); fake collectives move no
data, so the check's `all_gather_object` is answered with that table (`answered_gather`), after
checking that the calling rank's own report is its row. The verdict is then the check's own.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..parallel.fabric import GpuFabric, NodeFabric
from ..parallel.placement import Placement, PlacementError, check_placement, local_placement

TOPOLOGY_PATTERN = "switch.switch.node"
CLUSTER_UUID = "5e4ea25a-0000-4000-8000-000000000001"
"""The synthetic fabric's ClusterUUID (any non-zero UUID; the clique id is the rack's name)."""


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


def node_environ(cfg, alloc: Allocation, node: int) -> dict[str, str]:
    """What a rank on `node` finds in its environment."""
    from ..config.env import launch_env
    env = dict(launch_env(cfg)) if cfg.derived.system.is_gpu else {}
    host = alloc.hosts[node].split(".")[0]
    env.update(SLURM_TOPOLOGY_ADDR=f"rehearsal.{alloc.racks[node]}.{host}",
               SLURM_TOPOLOGY_ADDR_PATTERN=TOPOLOGY_PATTERN)
    return env


def node_fabric(cfg, alloc: Allocation, node: int) -> NodeFabric:
    """A healthy multi-node NVLink node of the allocation's rack: every GPU registered in the
    rack's clique, one IMEX channel."""
    gpus = [GpuFabric(gpu=f"00000000:{0x10 + i:02X}:00.0", state="Completed", status="Success",
                      cluster_uuid=CLUSTER_UUID, clique_id=alloc.racks[node], bandwidth="Full")
            for i in range(cfg.derived.system.gpus_per_node)]
    return NodeFabric(gpus=gpus, channels=["channel0"])


def report(cfg, alloc: Allocation) -> list:
    """What every rank of the job reports to the check: its Placement, or (rank, host, problem)
    when it cannot place itself (as check_placement gathers them). PlacementError when the
    allocation has too few nodes."""
    from .fake_world import dist_env
    d = cfg.derived
    per_node = d.system.gpus_per_node
    if len(alloc.hosts) < d.nodes:
        raise PlacementError(f"the allocation ({alloc.describe()}) has fewer nodes than the "
                             f"{d.nodes} the config needs")
    out: list = []
    for node in range(d.nodes):
        env, fabric = node_environ(cfg, alloc, node), node_fabric(cfg, alloc, node)
        for rank in range(node * per_node, min((node + 1) * per_node, d.world_size)):
            de = dist_env(rank, d.world_size, alloc.hosts[node], per_node)
            try:
                out.append(local_placement(cfg, de, env, probe=lambda: fabric))
            except PlacementError as e:
                out.append((rank, de.hostname, str(e)))
    return out


@contextmanager
def answered_gather(table: list):
    """torch.distributed.all_gather_object answers with `table` while the check runs."""
    import torch.distributed as dist
    real = dist.all_gather_object

    def gather(out, obj, group=None):
        rank = obj.rank if isinstance(obj, Placement) else obj[0]
        if table[rank] != obj:
            raise RuntimeError(f"rank {rank} reports {obj}, the allocation's table {table[rank]}")
        out[:] = table

    dist.all_gather_object = gather
    try:
        yield
    finally:
        dist.all_gather_object = real


def check(cfg, alloc: Allocation, rank: int = 0) -> tuple[list[Placement], str]:
    """`placement.check_placement` as rank `rank` runs it on `alloc`: (placements, what rank 0
    logs), or PlacementError with the check's own message."""
    from .fake_world import dist_env
    d = cfg.derived
    node = rank // d.system.gpus_per_node
    table = report(cfg, alloc)
    logged: list[str] = []
    with answered_gather(table):
        found = check_placement(
            cfg, dist_env(rank, d.world_size, alloc.hosts[node], d.system.gpus_per_node),
            environ=node_environ(cfg, alloc, node), log=logged.append,
            probe=lambda: node_fabric(cfg, alloc, node))
    return found, "\n".join(logged)
