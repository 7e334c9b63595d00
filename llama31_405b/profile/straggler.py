"""Stragglers: the ranks the others wait on.

Every rank's step ends together (the step's collectives synchronise them), so the step time
alone names nobody. What differs is how a rank spends it: a straggler is busy (computing, or on
the host: data, Python, a delay) while its peers sit in exposed communication waiting for it.
Per profiled rank: busy = step - exposed communication. Peers are the ranks with the same work:
the same pipeline stage (pipeline stages differ by design: the first holds the embedding, the
last the LM head and the loss). A rank whose busy time exceeds the median of its peers (the
others of its stage, so that with two peers the slow one is compared with the other, not with a
mean that contains itself) by more than `threshold` (a fraction of the peers' median step) is
named, with its host, device, and what it was
slow in: compute, or host time outside compute and communication.
"""
from __future__ import annotations

from statistics import median

DEFAULT_THRESHOLD = 0.10


def find(per_rank: dict, *, threshold: float = DEFAULT_THRESHOLD) -> list[dict]:
    """per_rank: rank -> {pp_rank, host, device, step_s, compute_s, host_gap_s, exposed_s,
    steps_busy: [(step_s, busy_s) per profiled step]}. A rank is named when its excess holds in
    every profiled step. Returns the stragglers, slowest first."""
    stages: dict = {}
    for r, d in per_rank.items():
        stages.setdefault(d.get("pp_rank", 0), []).append(r)
    out = []
    for stage, ranks in stages.items():
        if len(ranks) < 2:
            continue
        busy = {r: per_rank[r]["step_s"] - per_rank[r]["exposed_s"] for r in ranks}
        steps = {r: per_rank[r].get("steps_busy") for r in ranks}
        for r in ranks:
            peers = [q for q in ranks if q != r]
            med_busy = median(busy[q] for q in peers)
            med_step = median(per_rank[q]["step_s"] for q in peers)
            excess = busy[r] - med_busy
            if _consistent_excess(r, peers, steps) <= threshold:
                continue
            d = per_rank[r]
            dc = d["compute_s"] - median(per_rank[q]["compute_s"] for q in peers)
            dh = d["host_gap_s"] - median(per_rank[q]["host_gap_s"] for q in peers)
            out.append(dict(rank=r, host=d.get("host", "?"), device=d.get("device", "?"),
                            pp_rank=stage, busy_s=busy[r], peers_busy_median_s=med_busy,
                            excess_s=excess, excess_fraction=excess / med_step,
                            slow_in="compute" if dc >= dh else "host (outside compute and "
                                                                 "communication)",
                            compute_excess_s=dc, host_excess_s=dh, waiting_s=d["exposed_s"],
                            peers_waiting_median_s=median(per_rank[q]["exposed_s"]
                                                          for q in peers)))
    return sorted(out, key=lambda s: -s["excess_s"])


def _consistent_excess(r, peers, steps) -> float:
    """The smallest, over the profiled steps, of rank r's busy time beyond its peers' median, as
    a fraction of their median step: a straggler is slower in every step, while a rank that lost
    the CPU for a while in one step (scheduling noise) is not. steps[q]: [(step_s, busy_s)] of
    rank q per step."""
    n = min(len(steps[q] or ()) for q in (r, *peers))
    if n == 0:
        return float("-inf")
    out = float("inf")
    for k in range(n):
        med_busy = median(steps[q][k][1] for q in peers)
        med_step = median(steps[q][k][0] for q in peers)
        out = min(out, (steps[r][k][1] - med_busy) / med_step if med_step else 0.0)
    return out


def step_time_outliers(records: dict, *, threshold: float = DEFAULT_THRESHOLD) -> list[dict]:
    """From every rank's wall-clock step times (ranks/rank<R>.json, also the ranks without a
    trace): ranks whose mean profiled step differs from the median by more than threshold
    (a rank that ends its steps late, e.g. one that is not synchronised every step)."""
    means = {r: sum(d["profiled_step_s"]) / len(d["profiled_step_s"])
             for r, d in records.items() if d.get("profiled_step_s")}
    if len(means) < 2:
        return []
    med = median(means.values())
    return [dict(rank=r, host=records[r].get("host"), device=records[r].get("device"),
                 step_s=v, median_s=med) for r, v in sorted(means.items())
            if abs(v - med) > threshold * med]
