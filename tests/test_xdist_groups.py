"""`make test` runs pytest-xdist with `--dist loadgroup` so that the tests marked
`xdist_group("slurm")` run on one worker, the one that owns the local Slurm cluster. If the
grouping silently stops working (pytest-xdist 3.8.0 with pytest 9.2 does: the group suffix is
written to a node id attribute pytest no longer reads), the other worker blocks on the cluster's
lock for the whole Slurm suite. This runs a throwaway suite the same way and checks where the
grouped tests ran."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SUITE = '''
import os, time, pytest
pytestmark = pytest.mark.xdist_group("slurm")

@pytest.mark.parametrize("phase", ["step", "eval"])
def test_grouped(phase):
    time.sleep(0.3)
    open(f"ran-{phase}", "w").write(os.environ["PYTEST_XDIST_WORKER"])

def test_grouped_too():
    time.sleep(0.3)
    open("ran-too", "w").write(os.environ["PYTEST_XDIST_WORKER"])
'''
OTHERS = '''
import time, pytest

@pytest.mark.parametrize("i", range(12))
def test_free(i):
    time.sleep(0.05)
'''


def test_grouped_tests_run_on_one_worker(tmp_path: Path):
    (tmp_path / "test_grouped.py").write_text(SUITE)
    (tmp_path / "test_free.py").write_text(OTHERS)
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
                        "--dist", "loadgroup", "-q", str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    ran = {f.name: f.read_text() for f in tmp_path.glob("ran-*")}
    assert sorted(ran) == ["ran-eval", "ran-step", "ran-too"], p.stdout
    assert len(set(ran.values())) == 1, f"the xdist_group tests ran on different workers: {ran}"


SCHEDULED_CONFTEST = '''
import sys
sys.path.insert(0, {tests!r})
import pytest
from conftest_schedule import assign_groups, order

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    assign_groups(items)
    order(items)
'''
SHARED = '''
import os, time, pytest

@pytest.fixture(scope="module")
def built():
    open(f"built-{os.getpid()}", "w").write(os.environ["PYTEST_XDIST_WORKER"])
    return 1

@pytest.mark.parametrize("i", range(4))
def test_shared(built, i):
    time.sleep(0.1)
'''
LAST_BY_NAME = '''
import os, time, pytest
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]

@pytest.mark.parametrize("i", range(2))
def test_cluster(i):
    time.sleep(0.3)
'''
LOGGER = '''
import os, time

def pytest_runtest_setup(item):
    with open("order.log", "a") as f:
        f.write(f"{os.environ['PYTEST_XDIST_WORKER']} {item.name}\\n")
'''


def test_make_tests_schedule_builds_module_fixtures_once_and_starts_with_slurm(tmp_path: Path):
    """The grouping and order of tests/conftest_schedule.py under `make test`'s xdist options:
    the tests sharing a module fixture run on one worker (the fixture is built once), and the
    Slurm group, collected last here, runs before anything else on its worker."""
    tests = str(Path(__file__).parent)
    (tmp_path / "conftest.py").write_text(SCHEDULED_CONFTEST.format(tests=tests) + LOGGER)
    (tmp_path / "test_a_shared.py").write_text(SHARED)
    (tmp_path / "test_free.py").write_text(OTHERS)
    (tmp_path / "test_z_cluster.py").write_text(LAST_BY_NAME)
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
                        "--dist", "loadgroup", "--no-loadscope-reorder", "-q", str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(list(tmp_path.glob("built-*"))) == 1, "the module fixture was built more than once"
    runs = [line.split() for line in (tmp_path / "order.log").read_text().splitlines()]
    cluster_worker = {w for w, name in runs if name.startswith("test_cluster")}
    assert len(cluster_worker) == 1
    on_that_worker = [name for w, name in runs if w in cluster_worker]
    assert [n.startswith("test_cluster") for n in on_that_worker[:2]] == [True, True], runs


class _Item:
    """What conftest_schedule reads of a pytest item."""

    def __init__(self, nodeid: str, fixtures=(), group: str | None = None, slow: bool = False):
        import pytest as _pytest
        self.nodeid, self.fixturenames = nodeid, list(fixtures)
        self._marks = {}
        if group:
            self._marks["xdist_group"] = _pytest.mark.xdist_group(group).mark
        if slow:
            self._marks["slow"] = _pytest.mark.slow.mark

    def get_closest_marker(self, name):
        return self._marks.get(name)


def test_slurm_tests_without_the_tiny_data_go_first():
    """The session's first minute builds tiny_env on one core; the Slurm tests that do not wait
    for it run then, in collection order, and the unit tests come last."""
    from conftest_schedule import order
    items = [_Item("a::unit"),
             _Item("s::converge", ["slurm_cluster", "tiny_env"], "slurm", slow=True),
             _Item("s::preflight", ["slurm_cluster"], "slurm", slow=True),
             _Item("t::chain", ["tiny_runs"], "tiny_runs", slow=True),
             _Item("s::scancel", ["slurm_cluster", "tiny_env"], "slurm", slow=True),
             _Item("n::nodes", ["slurm_cluster"], "slurm", slow=True),
             _Item("b::slow", ["tmp_path"], slow=True)]
    order(items)
    assert [it.nodeid for it in items] == ["s::preflight", "n::nodes", "s::converge",
                                           "s::scancel", "t::chain", "b::slow", "a::unit"]
