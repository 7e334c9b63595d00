"""Interval arithmetic on [start, end) pairs (microseconds, as in Chrome traces).

Every figure of the analysis is a measure (total length) of unions, intersections and
differences of interval sets, and one partition of a step window (`partition`): at each instant
of the window the active labels decide which component owns it. docs/profile.md states the
rules.
"""
from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float]


def union(ivs: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points; empty intervals dropped."""
    out: list[list[float]] = []
    for s, e in sorted(iv for iv in ivs if iv[1] > iv[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def measure(ivs: Iterable[Interval]) -> float:
    """Total length of the union."""
    return sum(e - s for s, e in union(ivs))


def intersect(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """Points in both (unions of a and b)."""
    a, b = union(a), union(b)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """Points of a not in b."""
    out = []
    b = union(b)
    for s, e in union(a):
        cur = s
        for bs, be in b:
            if be <= cur:
                continue
            if bs >= e:
                break
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
            if cur >= e:
                break
        if cur < e:
            out.append((cur, e))
    return out


def clip(ivs: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    """The parts inside [lo, hi)."""
    return [(max(s, lo), min(e, hi)) for s, e in ivs if min(e, hi) > max(s, lo)]


def partition(labelled: Iterable[tuple[Interval, object]], lo: float, hi: float
              ) -> list[tuple[float, float, frozenset]]:
    """Cut [lo, hi) at every interval boundary: (start, end, labels active on it) for each
    piece, labels possibly empty. A sweep over sorted boundaries: O(n log n)."""
    points: list[tuple[float, int, object]] = []
    for (s, e), label in labelled:
        s, e = max(s, lo), min(e, hi)
        if e > s:
            points.append((s, 1, label))
            points.append((e, -1, label))
    points.sort(key=lambda p: (p[0], p[1]))
    active: dict[object, int] = {}
    out = []
    cur = lo
    for t, d, label in points:
        if t > cur:
            out.append((cur, t, frozenset(active)))
            cur = t
        if d > 0:
            active[label] = active.get(label, 0) + 1
        else:
            active[label] -= 1
            if not active[label]:
                del active[label]
    if hi > cur:
        out.append((cur, hi, frozenset(active)))
    return out
