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
