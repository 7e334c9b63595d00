"""Placement check: the groups that run on NVLink must lie inside one NVLink domain.

Run once, right after the process group is up and before the model is built or a checkpoint is
read: a group split across NVLink domains would run its collectives and pipeline sends over the
scale-out network, many times slower, and nothing else would tell. Which groups that are comes
from the system (`local_kinds`): where the NVLink domain spans nodes (GB200 NVL72, a "rack") every
TP, CP and PP group; on 8-GPU systems, whose domain is the node, the TP groups, and the CP groups
when TP x CP fits the node (PP, and wider CP, span nodes by design). There a model-parallel group
(a pipeline) whose nodes hang under different leaf switches of Slurm's topology is reported as a
warning with the traffic it sends through the spine (`switch_warnings`).

Each rank learns its rack from, in order:
1. `system.rack_of_host` in the config (an explicit hostname -> rack map, patterns allowed);
2. the GB200 fabric clique reported by the driver (`nvidia-smi -q`: ClusterUUID + CliqueId;
   the GPUs of one NVL72 rack share one clique);
3. Slurm's `SLURM_TOPOLOGY_ADDR` (topology/tree: the leaf switch; topology/block: the block);
4. otherwise the host itself (a single node is always one NVLink domain).
On 8-GPU systems the domain is the host itself, and Slurm's leaf switch is kept beside it.
On systems whose NVLink domain spans nodes (GB200 NVL72) every rank first checks its node's
multi-node NVLink readiness (parallel/fabric.py: fabric state Completed/Success, one clique per
node, an IMEX channel visible); a missing piece fails the job, because NCCL would otherwise carry
the rack's traffic over the scale-out network without a word. There the GPU's clique is the rack
(unless system.rack_of_host is set, in which case the groups must fit both).
The ranks exchange (rank, host, rack) with one all_gather_object; every rank then evaluates the
same pure function `find_violations` and raises the same `PlacementError`, so the whole job
stops within seconds with one message naming group kind, ranks and hosts.
"""
from __future__ import annotations

import fnmatch
import os
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Mapping

from .fabric import (MNNVL_FIX, NodeFabric, mnnvl_problems, needs_mnnvl, node_clique, parse_fabric,
                     probe_node)
from .layout import Layout
from .pipelines import format_replica_map, hop_traffic, predicted_step, switch_spans, switch_warnings
from .ranges import _ranges, _short

MAX_LINES = 20
"""Violation lines printed in a PlacementError message (the count of the rest is given)."""


class PlacementError(RuntimeError):
    """The ranks of this job are placed so that a model-parallel group spans racks (or the job's
    size does not match the config); the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class Placement:
    rank: int
    host: str
    rack: str
    source: str
    """Where the rack came from: "config", "fabric", "slurm-topology" or "host"."""
    clique: str = ""
    """The GPU's NVLink fabric clique (ClusterUUID/CliqueId) on multi-node NVLink systems, which
    the placement check probes; "" elsewhere."""
    switch: str = ""
    """The leaf switch (or block) of Slurm's topology above this host on 8-GPU systems; "" when
    Slurm knows no topology or the rack already is that unit."""


# --- where is this rank? ----------------------------------------------------------------------

def rack_from_override(host: str, rack_of_host: Mapping[str, str]) -> str | None:
    """The rack `rack_of_host` gives `host` (exact name first, then the first matching pattern).
    None when the map is empty; PlacementError when the map is set but does not cover `host`."""
    if not rack_of_host:
        return None
    if host in rack_of_host:
        return rack_of_host[host]
    short = host.split(".")[0]
    for pattern, rack in rack_of_host.items():
        if fnmatch.fnmatchcase(host, pattern) or fnmatch.fnmatchcase(short, pattern):
            return rack
    raise PlacementError(
        f"host {host!r} matches no key of system.rack_of_host ({', '.join(rack_of_host)}): "
        "add it (or a pattern covering it) to the config, or remove the table to detect racks")


def rack_from_fabric_text(nvidia_smi_q: str, local_rank: int = 0) -> str | None:
    """Rack name "<ClusterUUID>/<CliqueId>" from `nvidia-smi -q` output, or None when no GPU
    reports a completed multi-node NVLink fabric (H100/H200 HGX, GPUs without NVLink switches,
    an all-zero cluster UUID)."""
    return node_clique(NodeFabric(gpus=parse_fabric(nvidia_smi_q)), local_rank)


def rack_from_fabric(local_rank: int = 0) -> str | None:
    """The GB200 NVL72 clique of this node's GPUs as reported by the driver; None without
    nvidia-smi or without a multi-node NVLink fabric."""
    node = probe_node()
    return None if node.error else node_clique(node, local_rank)


def rack_from_slurm_topology(environ: Mapping[str, str]) -> str | None:
    """The leaf switch (topology/tree) or block (topology/block) above this node, from
    SLURM_TOPOLOGY_ADDR (e.g. "spine.rack0.n1" with pattern "switch.switch.node"); None when
    Slurm knows no topology (the address is just the node name)."""
    addr = environ.get("SLURM_TOPOLOGY_ADDR", "")
    parts = addr.split(".") if addr else []
    pattern = environ.get("SLURM_TOPOLOGY_ADDR_PATTERN", "").split(".")
    if len(parts) < 2:
        return None
    node_at = pattern.index("node") if "node" in pattern and len(pattern) == len(parts) \
        else len(parts) - 1
    if node_at < 1:
        return None
    return parts[node_at - 1]


def detect_rack(host: str, rack_of_host: Mapping[str, str], environ: Mapping[str, str],
                local_rank: int = 0,
                fabric: Callable[[int], str | None] = rack_from_fabric,
                node_domain: bool = False) -> tuple[str, str]:
    """(rack, source) of this process, trying the sources in the documented order; on 8-GPU
    systems (`node_domain`: the NVLink domain is the node) the host itself."""
    if node_domain:
        return host, "host"
    rack = rack_from_override(host, rack_of_host)
    if rack is not None:
        return rack, "config"
    rack = fabric(local_rank)
    if rack is not None:
        return rack, "fabric"
    rack = rack_from_slurm_topology(environ)
    if rack is not None:
        return rack, "slurm-topology"
    return host, "host"


# --- the pure check ---------------------------------------------------------------------------

_KIND_NAME = {"tp": "TP", "cp": "CP", "pp": "PP", "tp-cp-pp": "model-parallel (TP x CP x PP)"}
ALL_KINDS = ("tp", "cp", "pp")
"""The groups that must stay inside one NVLink domain where it spans nodes (NVL72)."""


def local_kinds(system, tp: int, cp: int) -> tuple[str, ...]:
    """The group kinds that must lie inside one NVLink domain on `system` (a SystemSpec): all of
    them where the domain spans nodes; on 8-GPU systems TP, and CP when TP x CP fits the node."""
    if not system.node_nvlink_domain:
        return ALL_KINDS
    return ("tp", "cp") if tp * cp <= system.gpus_per_nvlink_domain else ("tp",)


def _describe(group: list[int], by_rank: dict[int, Placement], word: str = "rack") -> str:
    racks: dict[str, list[int]] = defaultdict(list)
    for r in group:
        racks[by_rank[r].rack].append(r)
    parts = []
    for rack, ranks in sorted(racks.items()):
        hosts = sorted({by_rank[r].host for r in ranks})
        which = "rank" if len(ranks) == 1 else "ranks"
        if word == "node":
            parts.append(f"node {rack} ({which} {_ranges(ranks)})")
        else:
            parts.append(f"{word} {rack} ({which} {_ranges(ranks)} on {', '.join(_short(hosts))})")
    return "; ".join(parts)




def find_violations(layout: Layout, placements: list[Placement],
                    kinds: tuple[str, ...] = ALL_KINDS, word: str = "rack") -> list[str]:
    """Every group of `kinds` (default TP, CP and PP) whose ranks sit in more than one rack
    (`word`: "node" on 8-GPU systems, where a rack is a node), and racks holding different
    numbers of ranks; one line each, naming the group kind, ranks, racks and hosts. Empty when
    the placement is good. Pure: no process group, works for any world size."""
    by_rank = {p.rank: p for p in placements}
    missing = sorted(set(range(layout.world_size)) - set(by_rank))
    if missing or len(by_rank) != layout.world_size:
        return [f"placement known for {len(by_rank)} ranks, layout has {layout.world_size}"
                f"{f' (missing ranks {_ranges(missing)})' if missing else ''}"]
    out: list[str] = []
    split_kinds = []
    bad_ranks: set[int] = set()
    for kind in ("tp", "cp", "pp"):
        if getattr(layout, kind) == 1 or kind not in kinds:
            continue
        bad = [g for g in layout.groups(kind) if len({by_rank[r].rack for r in g}) > 1]
        for g in bad:
            out.append(f"{_KIND_NAME[kind]} group ranks {_ranges(g)} spans {word}s: "
                       f"{_describe(g, by_rank, word)}")
            bad_ranks.update(g)
        if bad:
            split_kinds.append(f"{len(bad)} {_KIND_NAME[kind]} group(s)")
    if split_kinds:
        mp = layout.groups("tp-cp-pp")
        n_bad = sum(not bad_ranks.isdisjoint(g) for g in mp)
        out.insert(0, f"{', '.join(split_kinds)} span {word}s; {n_bad} of {len(mp)} "
                      f"{_KIND_NAME['tp-cp-pp']} groups are split")
    counts: dict[str, list[int]] = defaultdict(list)
    for p in placements:
        counts[p.rack].append(p.rank)
    if len({len(v) for v in counts.values()}) > 1:
        sizes = ", ".join(f"{rack}: {len(ranks)} (hosts "
                          f"{', '.join(_short(sorted({by_rank[r].host for r in ranks})))})"
                          for rack, ranks in sorted(counts.items()))
        out.append(f"{word}s hold different numbers of ranks: {sizes}")
    return out


def rack_map(layout: Layout, placements: list[Placement]) -> dict[str, list[int]]:
    """Rack -> the DP ranks (model replicas) with at least one rank in it, racks sorted by their
    lowest global rank."""
    dp_of: dict[str, set[int]] = defaultdict(set)
    first: dict[str, int] = {}
    for p in placements:
        dp_of[p.rack].add(layout.coords(p.rank)["dp"])
        first[p.rack] = min(first.get(p.rack, p.rank), p.rank)
    return {rack: sorted(dp_of[rack]) for rack in sorted(dp_of, key=first.__getitem__)}


def format_rack_map(layout: Layout, placements: list[Placement], node_domain: bool = False) -> str:
    if node_domain:
        return format_replica_map(layout, placements)
    by_rack: dict[str, list[Placement]] = defaultdict(list)
    for p in placements:
        by_rack[p.rack].append(p)
    sources = sorted({p.source for p in placements})
    lines = [f"placement: {len(by_rack)} rack(s), world {layout.world_size}, "
             f"TP{layout.tp} CP{layout.cp} PP{layout.pp} DP{layout.dp}; racks from "
             f"{', '.join(sources)}"]
    for rack, dps in rack_map(layout, placements).items():
        ps = by_rack[rack]
        hosts = sorted({p.host for p in ps})
        lines.append(f"placement:   rack {rack}: DP ranks {_ranges(dps)} "
                     f"(global ranks {_ranges([p.rank for p in ps])}, {len(hosts)} host(s): "
                     f"{', '.join(_short(hosts))})")
    return "\n".join(lines)


def error_message(violations: list[str], node: int | None = None) -> str:
    """The PlacementError text; `node`: GPUs per node on 8-GPU systems (whose domain is the node)."""
    shown = violations[:MAX_LINES]
    more = len(violations) - len(shown)
    if node:
        return ("placement check failed: TP groups (and CP groups while TP x CP <= "
                f"{node}) must stay inside one node (NVLink domain).\n  " + "\n  ".join(shown)
                + (f"\n  ... and {more} more" if more > 0 else "")
                + f"\nFix: start {node} tasks per node in rank order (srun's default block "
                  "distribution; not --distribution=cyclic or a task count per node that differs "
                  "from the GPUs per node), one task per GPU.")
    return ("placement check failed: model-parallel groups must stay inside one rack (NVLink "
            "domain).\n  " + "\n  ".join(shown)
            + (f"\n  ... and {more} more" if more > 0 else "")
            + "\nFix: allocate whole racks in rank order (Slurm >= 23.11 with topology/block: "
              "sbatch --segment=<nodes per rack>; otherwise a node list ordered by rack), or set "
              "system.rack_of_host if the detected racks are wrong.")


# --- the collective wrapper -------------------------------------------------------------------

def layout_of(cfg) -> Layout:
    p = cfg.parallel
    return Layout(tp=p.tp, cp=p.cp, pp=p.pp, dp=cfg.derived.dp, order=p.order)


def local_placement(cfg, dist_env, environ: Mapping[str, str], *,
                    probe: Callable[[], NodeFabric] = probe_node) -> Placement:
    """This rank's placement. On GPU systems the process must carry the config's launch_env
    (config/env.py) exactly. On multi-node NVLink systems (GB200 NVL72) it first probes the
    node's fabric and IMEX channels and raises PlacementError naming every missing piece; the
    GPU's clique is then the rack unless system.rack_of_host says otherwise (both are checked)."""
    clique = ""
    system = cfg.derived.system
    if system.is_gpu:
        from ..config.env import env_mismatches
        wrong = env_mismatches(cfg, environ)
        if wrong:
            raise PlacementError(
                "environment differs from the config's launch_env (" + "; ".join(wrong) + "): "
                "launch through run_and_time.sh, which exports it (and passes it into the "
                "container with pyxis --container-env)")
    if needs_mnnvl(system):
        node = probe()
        problems = mnnvl_problems(node, min(system.gpus_per_node, cfg.derived.world_size))
        if problems:
            raise PlacementError("; ".join(problems))
        clique = node_clique(node, dist_env.local_rank) or ""
    if system.node_nvlink_domain:  # the NVLink domain is the node; Slurm's leaf switch beside it
        return Placement(rank=dist_env.rank, host=dist_env.hostname, rack=dist_env.hostname,
                         source="host", switch=rack_from_slurm_topology(environ) or "")
    rack, source = detect_rack(dist_env.hostname, cfg.system.rack_of_host, environ,
                               dist_env.local_rank,
                               fabric=(lambda lr: clique or None) if clique else rack_from_fabric)
    return Placement(rank=dist_env.rank, host=dist_env.hostname, rack=rack, source=source,
                     clique=clique)


def rank_errors_message(errors: list[tuple[int, str, str]]) -> str:
    """One line per distinct problem, naming the ranks and hosts that reported it (a fabric fault
    on 2048 nodes reads as one line, not 8192)."""
    by_problem: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for rank, host, problem in errors:
        by_problem[problem].append((rank, host))
    lines = []
    for problem, where in sorted(by_problem.items(), key=lambda kv: min(r for r, _ in kv[1])):
        hosts = sorted({h for _, h in where})
        lines.append(f"{problem} [rank(s) {_ranges([r for r, _ in where])} on "
                     f"{', '.join(_short(hosts))}]")
    shown = lines[:MAX_LINES]
    text = "placement check failed:\n  " + "\n  ".join(shown)
    if len(lines) > len(shown):
        text += f"\n  ... and {len(lines) - len(shown)} more"
    if any("IMEX" in p or "fabric" in p or "nvidia-smi" in p for p in by_problem):
        text += "\n" + MNNVL_FIX
    return text


def evaluate(layout: Layout, gathered: list, kinds: tuple[str, ...] = ALL_KINDS,
             node: int | None = None) -> list[Placement]:
    """The verdict on what the ranks reported (a Placement, or (rank, host, problem) from a rank
    that could not place itself): the placements when good, PlacementError otherwise. `kinds`:
    the groups that must stay inside one NVLink domain (`local_kinds`); `node`: GPUs per node on
    8-GPU systems, where that domain is the node. Pure."""
    errors = [g for g in gathered if isinstance(g, tuple)]
    if errors:
        raise PlacementError(rank_errors_message(errors))
    placements: list[Placement] = gathered
    if node:
        violations = find_violations(layout, placements, kinds, word="node")
        if violations:
            raise PlacementError(error_message(violations, node=node))
        return placements
    violations = find_violations(layout, placements, kinds)
    if not violations and all(p.clique for p in placements) \
            and any(p.rack != p.clique for p in placements):
        # racks came from system.rack_of_host or Slurm: the NVLink cliques must agree with them
        by_clique = [Placement(rank=p.rank, host=p.host, rack=p.clique, source="fabric")
                     for p in placements]
        violations = [f"NVLink clique: {v}" for v in find_violations(layout, by_clique)]
    if violations:
        raise PlacementError(error_message(violations))
    return placements


def check_placement(cfg, dist_env, group=None, *, environ: Mapping[str, str] | None = None,
                    log: Callable[[str], None] | None = None,
                    probe: Callable[[], NodeFabric] = probe_node,
                    gather: Callable[[object], list] | None = None) -> list[Placement]:
    """Collective over `group` (default: the world): every rank calls it after
    init_process_group and before building the model; or, with `gather` (every rank's object
    from this rank's, e.g. parallel.gather.all_gather), without any process group: the
    pre-flight's way. Returns all placements when good; raises
    PlacementError with the same message on every rank otherwise. Rank 0 logs the rack ->
    DP-rank mapping once (to stderr unless `log` is given). On multi-node NVLink systems each rank
    also checks its node's fabric state and IMEX channel (`fabric.mnnvl_problems`), and every
    model-parallel group must share one NVLink clique. On 8-GPU systems the TP (and node-sized
    CP) groups must stay inside a node, and rank 0 also logs pipelines spanning leaf switches
    as a warning."""
    env = os.environ if environ is None else environ
    layout = layout_of(cfg)
    if dist_env.world_size != layout.world_size:
        raise PlacementError(
            f"the job has {dist_env.world_size} ranks but {cfg.source or 'the config'} needs "
            f"{layout.world_size} (TP{layout.tp} x CP{layout.cp} x PP{layout.pp} x DP{layout.dp}); "
            f"launch {cfg.derived.nodes} node(s) x {cfg.derived.system.gpus_per_node} task(s) "
            "(run_and_time.sh does) or fix system.racks")
    try:
        mine: Placement | tuple[int, str, str] = local_placement(cfg, dist_env, env, probe=probe)
    except PlacementError as e:          # still take part in the collective, then fail together
        mine = (dist_env.rank, dist_env.hostname, str(e))
    gathered: list = [None] * dist_env.world_size
    if gather is not None:
        gathered = gather(mine)
    elif dist_env.world_size > 1:
        import torch.distributed as dist
        dist.all_gather_object(gathered, mine, group=group)
    else:
        gathered = [mine]
    system = cfg.derived.system
    node = system.gpus_per_node if system.node_nvlink_domain else None
    placements = evaluate(layout, gathered, local_kinds(system, layout.tp, layout.cp), node)
    if dist_env.rank == 0:
        say = log or (lambda s: print(s, file=sys.stderr, flush=True))
        say(format_rack_map(layout, placements, node_domain=node is not None))
        if node and switch_spans(layout, placements):
            for line in switch_warnings(layout, placements, hop_traffic(cfg, predicted_step(cfg))):
                say(line)
    return placements

