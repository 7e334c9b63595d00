"""Which ranks a rehearsal plays (pure).

Default: one rank per pipeline stage, so the first stage (embedding) and the last (output layer
and loss) are always among them, with the TP and CP positions taken in turn (TP fastest), so each
(TP, CP) position appears once when PP >= TP x CP, and the DP replica spread from the first
(rank 0) to the last (the highest ranks of the job).
"""
from __future__ import annotations

from ..parallel.placement import layout_of


def default_ranks(cfg) -> list[int]:
    p, dp = cfg.parallel, cfg.derived.dp
    layout = layout_of(cfg)
    out = []
    for stage in range(p.pp):
        coords = {"tp": stage % p.tp, "cp": (stage // p.tp) % p.cp, "pp": stage, "ep": 0,
                  "dp": stage * (dp - 1) // max(p.pp - 1, 1)}
        out.append(layout.rank(coords))
    return out


def parse_ranks(text: str, world_size: int) -> list[int]:
    """"0,5,8-11" -> [0, 5, 8, 9, 10, 11] (order kept, duplicates dropped); ValueError naming
    the item that is not a rank of the world."""
    out: list[int] = []
    seen: set[int] = set()
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        lo, sep, hi = item.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"--ranks: {item!r} is not a rank or a range A-B") from None
        if not 0 <= first <= last < world_size:
            raise ValueError(f"--ranks: {item!r} is outside the world of {world_size} ranks "
                             f"(0-{world_size - 1})")
        for r in range(first, last + 1):
            if r not in seen:
                seen.add(r)
                out.append(r)
    if not out:
        raise ValueError("--ranks: no rank given")
    return out


def coords_of(cfg, rank: int) -> dict[str, int]:
    return layout_of(cfg).coords(rank)
