"""The project's local Slurm cluster as a session-scoped pytest fixture.

`scripts/local_slurm_cluster.sh up` (root; installs Debian's Slurm packages on first use) starts
4 fake nodes in 2 racks before the first Slurm test and `down` stops them at the end of the
session. When the cluster cannot start, the tests FAIL with the script's output: a Slurm test that
silently skips would let a broken launcher pass CI. Deselect them with `-m "not slurm"` on a
machine that cannot run them (`make test-fast` does).

tests/conftest.py registers the fixture once for the whole session (a module that imported it
itself would get a second session instance, which would wait forever on the lock the first one
holds); Slurm test modules carry `pytest.mark.xdist_group("slurm")` so that one pytest-xdist
worker owns the cluster.
"""
from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "local_slurm_cluster.sh"
NODES, RACKS = 4, 2
LOCK = "/tmp/llama31_slurm.lock"


@dataclass
class SlurmCluster:
    nodes: int
    racks: int

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for sbatch/srun: the project's interpreter and this checkout on every fake
        node (same filesystem), and no page-cache dropping on a shared development machine."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "CONT", "NEXP", "SEED_BASE", "MASTER_"))}
        env.update(PYTHON=sys.executable, PYTHONPATH=str(REPO), CLEAR_CACHES="0")
        env.update(extra)
        return env

    def racks_order(self, order: str) -> None:
        _run([str(SCRIPT), "racks", order], timeout=120)

    def sbatch(self, args: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
        """Start `sbatch ARGS` (add --wait to block until the job ends)."""
        return subprocess.Popen(["sbatch", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, **kw)

    @staticmethod
    def job_id(first_line: str) -> int:
        m = re.search(r"Submitted batch job (\d+)", first_line)
        assert m, f"sbatch did not submit: {first_line!r}"
        return int(m.group(1))

    @staticmethod
    def job_active(job: int) -> bool:
        out = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%T"], capture_output=True,
                             text=True).stdout.strip()
        return bool(out)

    @staticmethod
    def wait_for(predicate, timeout: float, what: str, poll: float = 0.5):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            value = predicate()
            if value:
                return value
            time.sleep(poll)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _run(cmd: list[str], timeout: float) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


@pytest.fixture(scope="session")
def slurm_cluster():
    # one cluster per machine (/etc/slurm, fixed ports): a second test session waits here
    # instead of restarting the daemons under the first one's jobs
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _up()
            yield SlurmCluster(nodes=NODES, racks=RACKS)
        finally:
            subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=120)


def _up() -> None:
    env = dict(os.environ, SLURM_CI_NODES=str(NODES), SLURM_CI_RACKS=str(RACKS),
               SLURM_CI_RACK_ORDER="block")
    try:
        subprocess.run([str(SCRIPT), "up"], env=env, check=True, capture_output=True, text=True,
                       timeout=600)
    except subprocess.CalledProcessError as e:
        pytest.fail(f"the local Slurm cluster did not start ({SCRIPT} up exited {e.returncode}):\n"
                    f"{e.stdout}\n{e.stderr}", pytrace=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"the local Slurm cluster did not start: {e}", pytrace=False)
