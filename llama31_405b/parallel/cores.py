"""Ranks pinned to cores where a machine runs more ranks than it has cores (systems `pin_ranks`:
the 2-core development machine running 4 gloo ranks).

Left to the scheduler, four ranks on two cores do not share them fairly: a rank that got less
of a core reaches a collective late and its peers wait for it (`profile`'s "waiting for peers":
most of DP4's exposed DP time on the 2-core machine, 85-99 of 110-126 ms; docs/planner.md,
"Ranks pinned to cores"). Pinned, each core runs a fixed block of the machine's ranks, taken
in pipeline stage order (the ranks of stage 0 first, then stage 1's, each stage's in rank
order): ranks that share a core are one stage's TP, CP or DP peers wherever the machine has at
least as many cores as stages, they run the same work in step, and each takes an even share of
its core for the whole run. The planner's core share is then the ranks per core (planner
step.core_share).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

from .layout import Layout

__all__ = ["core_for", "pin_process"]


def core_for(layout: Layout, rank: int, local_rank: int, local_world: int,
             cores: Iterable[int]) -> int | None:
    """The core global rank `rank` (local rank `local_rank` of the `local_world` consecutive
    ranks on its machine) runs on, of the cores the process may use; None where every local
    rank can have a core of its own (nothing shared, nothing pinned)."""
    usable = sorted(cores)
    if not 0 <= local_rank < local_world or not 0 <= rank < layout.world_size:
        raise ValueError(f"rank {rank} (local rank {local_rank} of {local_world}) is not a rank "
                         f"of the {layout.world_size}-rank layout on a machine of {local_world}")
    if local_world <= len(usable):
        return None
    first = rank - local_rank
    ranks = sorted(range(first, first + local_world), key=lambda r: (layout.coords(r)["pp"], r))
    return usable[ranks.index(rank) * len(usable) // local_world]


def pin_process(layout: Layout, rank: int, local_rank: int, local_world: int) -> int | None:
    """Pin every thread of this process (those already started and so every one started later)
    to its core (`core_for`); the core, or None where nothing is pinned."""
    core = core_for(layout, rank, local_rank, local_world, os.sched_getaffinity(0))
    if core is None:
        return None
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), {core})
    return core
