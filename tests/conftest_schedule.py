"""How `make test` spreads the suite over its pytest-xdist workers (`--dist loadgroup
--no-loadscope-reorder`: a work unit is one test, or every test of one `xdist_group`, handed out
in collection order). Applied by tests/conftest.py at collection:

- groups: the tests that use `tiny_runs` form the group "tiny_runs" (the worker that trains the
  three runs then runs every test that reads them, instead of another worker waiting on the
  fixture's lock); the tests of a module that share a fixture living longer than one test
  (module scope, or a session fixture defined in the module itself) form one group per module,
  so that fixture is built once, not once per worker. Explicit `xdist_group` marks win.
- order: the Slurm group first (the longest chain of the suite, mostly waits on jobs and
  KillWait: it overlaps with everything else), then the tiny runs (their worker builds the tiny
  data and initial checkpoint, `tiny_env`, on one core in the session's first minute), then the
  slow tests that do not need `tiny_env` (they keep the other core busy meanwhile, where a test
  waiting for it would leave it idle), then the runs that start from the tiny runs' seeds (the
  NVFP4 run: long, so early), then the other slow tests, then the unit tests (short, they even
  out the end). Inside the Slurm group, the tests that need no `tiny_env` go first, for the same
  reason.
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


def needs_tiny_env(item) -> bool:
    names = getattr(item, "fixturenames", ())
    return "tiny_env" in names or "tiny_runs" in names


def rank(item) -> int:
    group = group_of(item)
    if group == "slurm":
        return 0
    if group == TINY_RUNS_GROUP:
        return 1
    slow = item.get_closest_marker("slow") is not None
    seeds = "tiny_run_seeds" in getattr(item, "fixturenames", ())
    if slow and not needs_tiny_env(item) and not seeds:
        return 2
    if seeds:
        return 3
    return 4 if slow else 5


def order(items) -> None:
    """Sort in place by rank (Slurm tests without tiny_env before those with it), keeping
    collection order otherwise."""
    items.sort(key=lambda it: (rank(it), rank(it) == 0 and needs_tiny_env(it)))
