"""Multi-node NVLink (MNNVL) readiness of one node, from what the driver itself reports.

On a GB200 NVL72 rack a model-parallel group spans 16 nodes over NVLink. NCCL takes that path only
when, on every node of the group,
1. each GPU's fabric registration is done: `nvidia-smi -q`, section "Fabric", State `Completed`
   and Status `Success` (the NVLink switches' fabric manager has placed the GPU in the domain);
2. the GPUs belong to one clique: ClusterUUID + CliqueId are the same for all GPUs of one NVLink
   partition (one NVL72 rack unless the administrator partitioned it);
3. the process can open an IMEX channel, a character device
   `/dev/nvidia-caps-imex-channels/channel<N>`: CUDA exports and imports the fabric memory handles
   that NCCL's MNNVL transport needs through it (the nvidia-imex service runs on the rack's nodes
   and the job, and its container, must see a channel).
When 3. is missing NCCL does not fail: it routes the rack's TP/CP/PP traffic over the scale-out
network, several times slower, and nothing else would tell. `mnnvl_problems` turns each missing
piece into a message naming what to do; the placement check fails the job on any of them.

Only systems whose NVLink domain is larger than one node need this (`needs_mnnvl`).
"""
from __future__ import annotations

import os
import re
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

IMEX_CHANNEL_DIR = Path("/dev/nvidia-caps-imex-channels")
_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")

MNNVL_FIX = (
    "Fix (GB200 multi-node NVLink): the nvidia-imex service must run on every node of the rack "
    "(nvidia-imex-ctl -N on a node shows its peers) and the job must be given an IMEX channel "
    "(Slurm >= 24.05: SwitchType=switch/nvidia_imex gives each job one; otherwise the driver's "
    "channel0), mounted into the container (/dev/nvidia-caps-imex-channels/channel<N>); the "
    "fabric state must read Completed/Success on every GPU (nvidia-smi -q, section Fabric: ask the "
    "administrator to check the NVLink switches' fabric manager). Do not run without it: NCCL "
    "would carry the rack's traffic over the scale-out network.")


@dataclass(frozen=True, slots=True)
class GpuFabric:
    """One GPU's "Fabric" section of `nvidia-smi -q`."""
    gpu: str
    """PCI bus id of the GPU ("" when the section came without a GPU header)."""
    state: str
    """"Completed", "In Progress", "Not Started", "Not Supported", "N/A"."""
    status: str
    """"Success" when the registration worked, an error text otherwise."""
    cluster_uuid: str
    clique_id: str
    bandwidth: str = ""
    """Health / Bandwidth ("Full", "Degraded", ...; "" when the driver does not report it)."""

    @property
    def clique(self) -> str | None:
        """"<ClusterUUID>/<CliqueId>" when the GPU is registered in a multi-node fabric."""
        uuid, clique = self.cluster_uuid, self.clique_id
        if self.state != "Completed" or not uuid or not clique:
            return None
        if uuid.upper() == "N/A" or clique.upper() == "N/A" or set(uuid.replace("-", "")) <= {"0"}:
            return None
        return f"{uuid}/{clique}"


def parse_fabric(nvidia_smi_q: str) -> list[GpuFabric]:
    """Every GPU's Fabric section of `nvidia-smi -q` text, in the order printed (GPUs by bus id).
    Keys of nested subsections (Health) are read as well; the first occurrence of a key wins."""
    out: list[GpuFabric] = []
    gpu = ""
    cur: dict[str, str] | None = None
    depth = 0

    def close() -> None:
        assert cur is not None
        out.append(GpuFabric(gpu=gpu, state=cur.get("State", ""), status=cur.get("Status", ""),
                             cluster_uuid=cur.get("ClusterUUID", ""),
                             clique_id=cur.get("CliqueId", ""), bandwidth=cur.get("Bandwidth", "")))

    for line in nvidia_smi_q.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if cur is not None and stripped and indent <= depth:     # the Fabric section ended
            close()
            cur = None
        m = _GPU_HEADER.match(line)
        if m:
            gpu = m.group(1)
            continue
        if stripped == "Fabric":
            cur, depth = {}, indent
            continue
        if cur is not None and ":" in stripped:
            key, _, value = stripped.partition(":")
            cur.setdefault(key.strip(), value.strip())
    if cur is not None:
        close()
    return out


def imex_channels(root: Path = IMEX_CHANNEL_DIR) -> list[str]:
    """Names of the IMEX channel devices this process sees (channel<N> character devices)."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    found = []
    for name in names:
        if not re.fullmatch(r"channel\d+", name):
            continue
        try:
            if stat.S_ISCHR(os.stat(root / name).st_mode):
                found.append(name)
        except OSError:
            continue
    return found


@dataclass(frozen=True, slots=True)
class NodeFabric:
    """What one process sees of its node's multi-node NVLink setup."""
    gpus: list[GpuFabric] = field(default_factory=list)
    channels: list[str] = field(default_factory=list)
    error: str = ""
    """Why `nvidia-smi -q` could not be read ("" when it was)."""


def probe_node(channel_dir: Path = IMEX_CHANNEL_DIR, timeout_s: float = 60.0) -> NodeFabric:
    """Run `nvidia-smi -q` and list the IMEX channels (GPU nodes; returns the error otherwise)."""
    try:
        proc = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True,
                              timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as e:
        return NodeFabric(channels=imex_channels(channel_dir), error=f"nvidia-smi -q: {e}")
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return NodeFabric(channels=imex_channels(channel_dir),
                          error=f"nvidia-smi -q exited {proc.returncode}: {tail[0]}")
    return NodeFabric(gpus=parse_fabric(proc.stdout), channels=imex_channels(channel_dir))


def mnnvl_problems(node: NodeFabric, gpus_needed: int = 1,
                   channel_dir: Path = IMEX_CHANNEL_DIR) -> list[str]:
    """Every reason NCCL could not use multi-node NVLink from this node (which runs `gpus_needed`
    ranks, one per GPU); [] when it can."""
    if node.error:
        return [f"cannot read the GPU fabric state ({node.error}); nvidia-smi must work inside "
                "the job (and the container)"]
    if not node.gpus:
        return ["nvidia-smi -q shows no GPU with a Fabric section: not a multi-node NVLink GPU, "
                "no GPU visible to the job, or a driver too old to report the fabric"]
    out = []
    if len(node.gpus) < gpus_needed:
        out.append(f"{len(node.gpus)} GPU(s) visible, the node runs {gpus_needed} ranks (one per "
                   f"GPU): request them (sbatch --gpus-per-node={gpus_needed}) where Slurm "
                   "constrains devices")
    for g in node.gpus:
        name = f"GPU {g.gpu}" if g.gpu else "a GPU"
        if g.state != "Completed" or g.status != "Success":
            out.append(f"{name}: fabric state {g.state or '?'}, status {g.status or '?'} (needs "
                       "Completed, Success: the GPU is not registered in the NVLink fabric)")
        elif g.clique is None:
            out.append(f"{name}: fabric registered without a cluster UUID / clique id "
                       f"({g.cluster_uuid or '?'}/{g.clique_id or '?'})")
        if g.bandwidth and g.bandwidth not in ("Full", "N/A"):
            out.append(f"{name}: fabric health bandwidth {g.bandwidth} (needs Full)")
    cliques = sorted({g.clique for g in node.gpus if g.clique})
    if len(cliques) > 1:
        out.append(f"the GPUs of one node are in {len(cliques)} NVLink cliques ({', '.join(cliques)})")
    if not node.channels:
        out.append(f"no IMEX channel in {channel_dir} (channel<N> character device): NCCL cannot "
                   "export fabric memory and would silently use the scale-out network")
    return out


def node_clique(node: NodeFabric, local_rank: int = 0) -> str | None:
    """The clique of this process's GPU among the node's registered GPUs (bus-id order, which CUDA
    follows on GB200); None when no GPU reports a multi-node fabric."""
    cliques = [g.clique for g in node.gpus if g.clique]
    return cliques[local_rank % len(cliques)] if cliques else None


def needs_mnnvl(system) -> bool:
    """True for GPU systems whose NVLink domain spans nodes (GB200/GB300 NVL72)."""
    return system.is_gpu and system.gpus_per_nvlink_domain > system.gpus_per_node
