"""Waiting for a peer: the part of a rank's exposed communication spent in a collective before
its last member called it.

A collective cannot finish before every member has called it, so a rank that arrives first sits
in it for as long as its slowest peer still computes: the trace counts that time as exposed
communication of the group (analysis.py), though no byte moves until the last member arrives.
The time after the last arrival is the transfer, what the planner's communication model
prices; the time before it is the peers' imbalance (on GPUs a straggler, on the CPU proof the
cores shared between ranks), which the model does not price. Reported beside the exposed time,
the split says which of the two an exposed figure holds (docs/profile.md).

How: each rank's calls of a group are matched in order across the group's members (every
member issues a group's collectives in the same program order; the groups of one dimension
on the same ranks, e.g. megatron-core's DATA_PARALLEL_GROUP and DATA_PARALLEL_GROUP_WITH_CP,
count as one sequence). The k-th call's last arrival is the latest start of its k-th calls over
the members; a rank's wait in it is its interval from its own start to that arrival, counted
where the analysis found it exposed (compute running meanwhile hides it as it hides a
transfer). The pipeline group is left out, its point-to-point transfers and its collectives
alike (megatron-core broadcasts the loss over it once a step): its waits are the pipeline's
fill and drain, the bubble, which the model prices as PP time.

Only the clocks of one host compare: a group whose members' records name different hosts (or
whose members were not all traced, or whose call counts differ) is not split, and says why.
"""
from __future__ import annotations

from bisect import bisect_left

P2P_NAMES = ("gloo:send", "gloo:recv", "SendRecv", "Send", "Recv")
"""Event names (substrings, on GPU the NCCL kernel's) of point-to-point transfers."""


def group_key(role: str, ranks) -> str:
    """A group's identity across its members: its dimension and its ranks."""
    return f"{role}:{','.join(str(r) for r in sorted(ranks))}"


def is_p2p(name: str) -> bool:
    return any(p in name for p in P2P_NAMES)


def rank_calls(comm, group_of) -> dict[str, list[tuple[float, float]]]:
    """One rank's collective calls per group key, in start order. `comm`: the analysis'
    communication intervals [((start, end), desc, name)]; `group_of(desc)` -> (desc, role,
    ranks). Groups of one rank or of unknown membership, the pipeline group and point-to-point
    events are left out."""
    out: dict[str, list] = {}
    for iv, desc, name in comm:
        _, role, ranks = group_of(desc)
        if len(ranks) < 2 or role == "PP" or is_p2p(name):
            continue
        out.setdefault(group_key(role, ranks), []).append(tuple(iv))
    return {k: sorted(v) for k, v in out.items()}


def _overlap(lo: float, hi: float, pieces: list[tuple[float, float, float]],
             starts: list[float]) -> float:
    """Weighted length of [lo, hi) within the sorted, disjoint `pieces` (start, end, weight)."""
    tot = 0.0
    i = bisect_left(starts, lo)
    while i > 0 and pieces[i - 1][1] > lo:
        i -= 1
    while i < len(pieces) and pieces[i][0] < hi:
        s, e, w = pieces[i]
        tot += max(0.0, min(e, hi) - max(s, lo)) * w
        i += 1
    return tot


def peer_waits(per_rank: dict) -> tuple[dict, dict]:
    """per_rank: rank -> {host, calls: {key: [(s, e)]}, exposed: [{key: [(s, e, w)]} per
    step], roles: {key: role}}, times in µs. Returns (rank -> {role: seconds per step waiting
    for a peer, exposed}, key -> why that group is not split)."""
    members: dict[str, list] = {}
    for r, d in per_rank.items():
        for key in d["calls"]:
            members.setdefault(key, []).append(r)
    skipped: dict[str, str] = {}
    waits: dict = {r: {} for r in per_rank}
    for key, ranks in sorted(members.items()):
        want = [int(x) for x in key.split(":", 1)[1].split(",")]
        traced = [r for r in want if r in per_rank]
        if len(traced) < len(want):
            skipped[key] = f"ranks {sorted(set(want) - set(traced))} not traced"
            continue
        hosts = {per_rank[r].get("host") for r in want}
        if len(hosts) > 1:
            skipped[key] = f"members on {len(hosts)} hosts (their clocks are not one)"
            continue
        counts = {len(per_rank[r]["calls"].get(key, [])) for r in want}
        if len(counts) > 1:
            skipped[key] = f"call counts differ between members ({sorted(counts)})"
            continue
        calls = [per_rank[r]["calls"].get(key, []) for r in want]
        last = [max(c[k][0] for c in calls) for k in range(counts.pop())]
        for r, own in zip(want, calls):
            steps = per_rank[r]["exposed"]
            role = per_rank[r]["roles"][key]
            total = 0.0
            for pieces_by_key in steps:
                pieces = pieces_by_key.get(key, [])
                starts = [p[0] for p in pieces]
                for (s, e), arrival in zip(own, last):
                    if arrival > s:
                        total += _overlap(s, min(e, arrival), pieces, starts)
            n = len(steps) or 1
            waits[r][role] = waits[r].get(role, 0.0) + total / n / 1e6
    return waits, skipped
