"""Compact text for rank and host lists in placement messages (thousands of ranks per line)."""
from __future__ import annotations


def _short(hosts: list[str], limit: int = 4) -> list[str]:
    return hosts if len(hosts) <= limit else hosts[:limit] + [f"... {len(hosts) - limit} more"]


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    vs = sorted(set(values))
    out, i = [], 0
    while i < len(vs):
        j = i
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        out.append(str(vs[i]) if i == j else f"{vs[i]}-{vs[j]}")
        i = j + 1
    return ",".join(out)
