"""Pipelines on 8-GPU systems: where a model-parallel group spans nodes, which leaf switches its
nodes hang under, and what a pipeline hop through the spine costs per step.

On DGX/HGX nodes the NVLink domain is the node, so a TP4-PP8-CP2 replica spans 8 nodes and its
pipeline sends cross the scale-out network. That is by design (config/validate.py); a pipeline
whose nodes sit under different leaf switches of Slurm's topology is not an error either, but its
hops then cross the spine. `switch_warnings` reports that with the traffic each crossing hop
sends per step; the placement check logs it on rank 0 (parallel/placement.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .layout import Layout
from .ranges import _ranges, _short

if TYPE_CHECKING:
    from .placement import Placement


def switch_spans(layout: Layout, placements: list[Placement]) -> list[tuple[list[int], list[str]]]:
    """(ranks, leaf switches) of every model-parallel group (a pipeline with its TP and CP
    peers) whose hosts hang under more than one leaf switch; [] when the switches are unknown."""
    by_rank = {p.rank: p for p in placements}
    if not by_rank or any(not p.switch for p in placements):
        return []
    out = []
    for g in layout.groups("tp-cp-pp"):
        switches = sorted({by_rank[r].switch for r in g})
        if len(switches) > 1:
            out.append((g, switches))
    return out


@dataclass(frozen=True, slots=True)
class HopTraffic:
    """What one pipeline hop sends per training step (the expected cost of a hop through the
    spine): `sends` activations of `send_bytes` each way, on `scaleout_gbs` per GPU."""
    sends: int
    send_bytes: float
    scaleout_gbs: float
    step_s: float | None = None
    """The planner's predicted step, for scale (None when unknown)."""

    @property
    def seconds(self) -> float:
        """One direction of a hop at the GPU's scale-out rate (the link is full duplex)."""
        return self.sends * self.send_bytes / (self.scaleout_gbs * 1e9)


def hop_traffic(cfg, step_s: float | None = None) -> HopTraffic:
    """Per-step traffic of one pipeline hop of `cfg`: each microbatch crosses a hop once per
    model chunk each way, as a 1/TP shard (sequence parallelism) of MBS x seq/CP x hidden BF16
    values, on each TP rank's own NIC."""
    p, m, d = cfg.parallel, cfg.model, cfg.derived
    shard = p.tp if p.sequence_parallel else 1
    send = cfg.batch.micro_batch_size * m.seq_length / p.cp * m.hidden_size * 2 / shard
    return HopTraffic(sends=d.num_microbatches * p.vp, send_bytes=send,
                      scaleout_gbs=d.system.scaleout_gbs, step_s=step_s)


def switch_warnings(layout: Layout, placements: list[Placement], traffic: HopTraffic) -> list[str]:
    """Warnings (never errors) for pipelines spanning leaf switches on 8-GPU systems: how many,
    an example with its switches and hosts, and the traffic each crossing hop sends through the
    spine per step. Pure."""
    spans = switch_spans(layout, placements)
    if not spans:
        return []
    by_rank = {p.rank: p for p in placements}
    ranks, switches = spans[0]
    hosts = {sw: sorted({by_rank[r].host for r in ranks if by_rank[r].switch == sw})
             for sw in switches}
    where = "; ".join(f"switch {sw}: {', '.join(_short(h))}" for sw, h in hosts.items())
    stages = layout.group_of("pp", ranks[0])  # one pipeline of the example, stage by stage
    crossing = sum(by_rank[a].switch != by_rank[b].switch
                   for a, b in zip(stages, stages[1:] + stages[:1]))
    gb = traffic.sends * traffic.send_bytes / 1e9
    scale = (f", {traffic.seconds / traffic.step_s:.1%} of the predicted {traffic.step_s:.2f} s "
             "step" if traffic.step_s else "")
    return [f"warning: {len(spans)} of {layout.dp} model-parallel groups (pipelines) span leaf "
            f"switches, e.g. ranks {_ranges(ranks)} ({where}; {crossing} of its {len(stages)} "
            f"pipeline hops cross, on every TP and CP rank). Expected cost: each crossing hop "
            f"sends {traffic.sends} activations of {traffic.send_bytes / 1e6:.1f} MB each way per "
            f"step ({gb:.2f} GB), "
            f"{traffic.seconds * 1e3:.0f} ms at the {traffic.scaleout_gbs:g} GB/s per-GPU "
            f"scale-out rate{scale}; the schedule overlaps it with compute, so it costs what "
            "the spine's contention with the DP traffic adds, more on an oversubscribed spine. "
            "Keep each pipeline's nodes under one leaf switch (sbatch --segment = the nodes of "
            "one model-parallel group, on Slurm >= 23.11 with topology/block) where possible."]


def format_replica_map(layout: Layout, placements: list[Placement]) -> str:
    """8-GPU systems: one line per model replica (DP rank) with its nodes and leaf switches."""
    by_rank = {p.rank: p for p in placements}
    hosts = {p.host for p in placements}
    lines = [f"placement: {len(hosts)} node(s), world {layout.world_size}, TP{layout.tp} "
             f"CP{layout.cp} PP{layout.pp} DP{layout.dp}; NVLink domain = node"]
    for g in layout.groups("tp-cp-pp"):
        ghosts = sorted({by_rank[r].host for r in g})
        switches = sorted({by_rank[r].switch for r in g if by_rank[r].switch})
        lines.append(f"placement:   DP rank {layout.coords(g[0])['dp']}: global ranks "
                     f"{_ranges(g)}, {len(ghosts)} node(s): {', '.join(_short(ghosts))}"
                     + (f"; leaf switch(es) {', '.join(switches)}" if switches else ""))
    return "\n".join(lines)


def predicted_step(cfg) -> float | None:
    """The planner's step time for the warning's scale (None where it cannot predict)."""
    try:
        from ..planner import predict
        return predict(cfg).step_time_s
    except Exception:  # noqa: BLE001 (a warning's detail must never fail the check)
        return None
