"""How `make test` spreads the suite over its pytest-xdist workers (`--dist loadgroup
--no-loadscope-reorder`: a work unit is one test, or every test of one `xdist_group`, handed out
in collection order). Applied by tests/conftest.py at collection:

- groups: the tests that use `tiny_runs` form the group "tiny_runs" (the worker that trains the
  three runs then runs every test that reads them, instead of another worker waiting on the
  fixture's lock); the tests of a module that share a fixture living longer than one test
  (module scope, or a session fixture defined in the module itself) form one group per module,
  so that fixture is built once, not once per worker. Explicit `xdist_group` marks win.
- order: the Slurm group first (the longest chain of the suite, mostly waits on jobs and
  KillWait: it overlaps with everything else), then the tiny runs and the runs that start from
  their seeds, then every other slow test, then the unit tests (short, they even out the end).
  Inside the Slurm group, the tests that need no tiny data or checkpoint (`tiny_env`) go first:
  the session's first minute builds them on one core while every test that needs them waits,
  so the cluster's 16-rank jobs use the other core instead of waiting too.
"""
from __future__ import annotations

import pytest

TINY_RUNS_GROUP = "tiny_runs"
LONG_LIVED = ("module", "class", "package", "session")


def group_of(item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def module_of(item) -> str:
    return item.nodeid.split("::", 1)[0]


def shares_module_state(item) -> bool:
    """True when the test uses a fixture built once for several tests of its own module: a module
    or class fixture, or a session fixture defined in the test module (conftest's session
    fixtures are shared through files and locks, not per worker)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    module = module_of(item)
    for defs in info.name2fixturedefs.values():
        for fd in defs:
            scope = fd.scope if isinstance(fd.scope, str) else fd.scope.value
            if scope in ("module", "class") or (scope in LONG_LIVED and fd.baseid == module):
                return True
    return False


def assign_groups(items) -> None:
    for item in items:
        if group_of(item) is not None:
            continue
        if "tiny_runs" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(TINY_RUNS_GROUP))
        elif shares_module_state(item):
            item.add_marker(pytest.mark.xdist_group(module_of(item)))


def rank(item) -> int:
    group = group_of(item)
    if group == "slurm":
        return 0
    if group == TINY_RUNS_GROUP or "tiny_run_seeds" in getattr(item, "fixturenames", ()):
        return 1
    if item.get_closest_marker("slow") is not None:
        return 2
    return 3


def needs_tiny_env(item) -> bool:
    return "tiny_env" in getattr(item, "fixturenames", ())


def order(items) -> None:
    """Sort in place by rank (Slurm tests without tiny_env before those with it), keeping
    collection order otherwise."""
    items.sort(key=lambda it: (rank(it), rank(it) == 0 and needs_tiny_env(it)))
