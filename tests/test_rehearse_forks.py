"""rehearse/forks.py: a child is a fork of the preloaded server (torch and megatron-core already
imported when its main runs), gets the children's environment, writes its output to its log and
exits with main's status; a process that already runs another forkserver gets no fork (the
rehearsal then starts plain interpreters)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.coverage_env import coverage_env

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow      # the server imports torch and megatron-core

PROBE = '''
import json, os, sys
def main(argv):
    print(json.dumps({"argv": argv, "preloaded": "megatron.core" in sys.modules,
                      "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                      "mark": os.environ.get("FORK_MARK"), "pid": os.getpid()}))
    return int(argv[0])
'''

DRIVER = '''
import json, os, sys
from llama31_405b.rehearse.forks import Forks
if sys.argv[1] == "busy":
    import multiprocessing.forkserver as fs
    fs.ensure_running()
f = Forks({"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "FORK_MARK": "x"})
if f.ctx is None:
    print(json.dumps({"fork": None}))
    sys.exit(0)
out = []
for code in (0, 3):
    p = f.start("fork_probe", [str(code)], os.path.join(sys.argv[2], f"log{code}"))
    p.join()
    out.append(p.exitcode)
print(json.dumps({"fork": out, "me": os.getpid()}))
'''


def _drive(tmp_path: Path, mode: str) -> dict:
    (tmp_path / "fork_probe.py").write_text(PROBE)
    r = subprocess.run([sys.executable, "-c", DRIVER, mode, str(tmp_path)], cwd=REPO,
                       env={"PYTHONPATH": f"{REPO}:{tmp_path}", "PATH": "/usr/bin:/bin",
                            "PYTHONWARNINGS": "ignore", **coverage_env()},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_fork_runs_main_with_the_modules_preloaded(tmp_path):
    res = _drive(tmp_path, "own")
    assert res["fork"] == [0, 3]                           # main's return value is the status
    for code in (0, 3):
        child = json.loads((tmp_path / f"log{code}").read_text().strip().splitlines()[-1])
        assert child["argv"] == [str(code)] and child["preloaded"] is True
        assert child["cuda"] == "" and child["mark"] == "x"
        assert child["pid"] != res["me"]


def test_no_fork_where_another_forkserver_runs(tmp_path):
    assert _drive(tmp_path, "busy") == {"fork": None}


def test_the_servers_environment_is_set_for_its_start_and_restored_after(monkeypatch):
    """A variable the process had gets its value back, one it lacked is removed again."""
    from llama31_405b.rehearse.forks import _environ
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with _environ({"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}):
        assert os.environ["OMP_NUM_THREADS"] == "1" and os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert os.environ["OMP_NUM_THREADS"] == "7" and "CUDA_VISIBLE_DEVICES" not in os.environ
