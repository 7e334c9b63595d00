"""Rank groups as pure arithmetic over Megatron's order string ("tp-cp-ep-pp-dp").

The first dimension of the order varies fastest across consecutive ranks. With DP last, the
TP x CP x PP ranks of one model replica are consecutive, so on a system whose racks hold
consecutive ranks, every model-parallel group lies inside one rack. Works for cluster-sized
worlds without creating a single process group.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Layout:
    tp: int
    cp: int
    pp: int
    dp: int
    ep: int = 1
    order: str = "tp-cp-ep-pp-dp"

    @property
    def dims(self) -> list[str]:
        return self.order.split("-")

    @property
    def sizes(self) -> list[int]:
        return [getattr(self, d) for d in self.dims]

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes)

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinate of `rank` along each dimension."""
        out, r = {}, rank
        for d, s in zip(self.dims, self.sizes):
            out[d], r = r % s, r // s
        return out

    def rank(self, coords: dict[str, int]) -> int:
        r, stride = 0, 1
        for d, s in zip(self.dims, self.sizes):
            r += coords.get(d, 0) * stride
            stride *= s
        return r

    def groups(self, kind: str) -> list[list[int]]:
        """All groups of `kind`: one dimension ("tp", "dp", ...) or several joined by "-"
        (e.g. "tp-cp-pp" = a model-parallel group). Ranks in a group differ only along those
        dimensions; each group is sorted."""
        along = kind.split("-")
        for d in along:
            if d not in self.dims:
                raise ValueError(f"unknown dimension {d!r} in {kind!r}")
        others = [d for d in self.dims if d not in along]
        groups = []
        for fixed in itertools.product(*(range(getattr(self, d)) for d in others)):
            base = dict(zip(others, fixed))
            members = [self.rank({**base, **dict(zip(along, vary))})
                       for vary in itertools.product(*(range(getattr(self, d)) for d in along))]
            groups.append(sorted(members))
        return sorted(groups)

    def group_of(self, kind: str, rank: int) -> list[int]:
        c = self.coords(rank)
        along = kind.split("-")
        return sorted(self.rank({**c, **dict(zip(along, vary))})
                      for vary in itertools.product(*(range(getattr(self, d)) for d in along)))


def rack_of_rank(rank: int, gpus_per_rack: int) -> int:
    """Rack of a rank when ranks fill racks in order (Slurm block placement)."""
    return rank // gpus_per_rack
