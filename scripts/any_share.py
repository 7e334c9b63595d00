"""The share of `Any` expressions of each GPU-path module (issue 44, point 1), read from mypy's
`--any-exprs-report` (its any-exprs.txt), for `make typecheck` (scripts/typecheck.py;
docs/typecheck.md).

mypy counts an expression "Any" when its type is Any: a call into an unannotated library
function, an attribute of such a result, a value of a dict typed `dict[str, Any]`. A wrong
attribute or argument on such an expression is reported by no check. The GPU-path modules (the
code the CPU tests cannot run in full) must keep that share at or below their limit: DEFAULT_LIMIT,
or the module's entry in LIMITS, whose reason stands beside it.

mypy does not count the bodies of unannotated functions; mypy.ini makes the GPU-path modules
refuse those (disallow_untyped_defs), so every expression of theirs is counted.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

GPU_PATH = ("llama31_405b.model", "llama31_405b.precision", "llama31_405b.parallel.setup",
            "llama31_405b.train", "llama31_405b.first_contact")
"""A module is on the GPU path when it is one of these or inside one (mypy.ini's strict section
names the same modules)."""

DEFAULT_LIMIT = 5.0
"""Percent of a module's expressions that may be Any (docs/typecheck.md: why 5)."""

LIMITS: dict[str, tuple[float, str]] = {
    # module: (limit in percent, the reason it is above DEFAULT_LIMIT)
}

_ROW = re.compile(r"^\s*(?P<name>[\w.]+)\s+(?P<anys>\d+)\s+(?P<exprs>\d+)\s+[\d.]+%\s*$")


@dataclass(frozen=True)
class Share:
    module: str
    exprs: int
    anys: int

    @property
    def percent(self) -> float:
        return 100.0 * self.anys / self.exprs if self.exprs else 0.0


def parse(text: str) -> list[Share]:
    """The rows of any-exprs.txt (`Name  Anys  Exprs  Coverage`), the Total row left out."""
    rows = []
    for line in text.splitlines():
        m = _ROW.match(line)
        if m and m["name"] != "Total":
            rows.append(Share(m["name"], int(m["exprs"]), int(m["anys"])))
    return rows


def on_gpu_path(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in GPU_PATH)


def limit_of(module: str) -> float:
    return LIMITS[module][0] if module in LIMITS else DEFAULT_LIMIT


def check(rows: list[Share]) -> tuple[list[str], list[str]]:
    """(the table's lines, one line per failure). A failure: a GPU-path module above its limit,
    a GPU-path package with no row at all (the report did not cover it), or a LIMITS entry for
    a module the report does not have (a stale exception)."""
    gpu = sorted((r for r in rows if on_gpu_path(r.module)), key=lambda r: r.module)
    width = max([len(r.module) for r in gpu] + [len("module")])
    table = [f"{'module':<{width}}  {'expressions':>11}  {'Any':>5}  {'%':>5}  limit"]
    failures = []
    for r in gpu:
        limit = limit_of(r.module)
        over = r.percent > limit
        table.append(f"{r.module:<{width}}  {r.exprs:>11}  {r.anys:>5}  {r.percent:>5.1f}  "
                     f"{limit:g}{'  ABOVE' if over else ''}")
        if over:
            failures.append(f"{r.module}: {r.percent:.1f} % of its {r.exprs} expressions are "
                            f"Any ({r.anys}), above its limit of {limit:g} %")
    total_exprs, total_anys = sum(r.exprs for r in gpu), sum(r.anys for r in gpu)
    if gpu:
        table.append(f"{'GPU path':<{width}}  {total_exprs:>11}  {total_anys:>5}  "
                     f"{100.0 * total_anys / max(total_exprs, 1):>5.1f}")
    for p in GPU_PATH:
        if not any(r.module == p or r.module.startswith(p + ".") for r in gpu):
            failures.append(f"{p}: not in mypy's any-exprs report (is it still checked?)")
    known = {r.module for r in rows}
    for m in sorted(set(LIMITS) - known):
        failures.append(f"{m}: has a limit in scripts/any_share.py LIMITS but no row in the "
                        "report: delete the entry")
    return table, failures
