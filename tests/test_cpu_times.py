"""`--cpu-times` (tests/conftest_cpu_times.py) and its summary (bench/test_cpu_times.py): a test
whose child process burns CPU is charged that CPU, a sleeping test is not, and the summary ranks
them."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

CASES = '''
import subprocess, sys, time

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c",
                    "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.6: pass"],
                   check=True)

def test_sleeps():
    time.sleep(0.6)
'''


def test_each_phase_is_charged_its_own_and_its_childrens_cpu(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    rec = tmp_path / "cpu.jsonl"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "no:xdist", "-c", "/dev/null", "--rootdir", str(tmp_path),
                        "-p", "conftest_cpu_times", "--cpu-times", str(rec), str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(REPO / "tests"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(x) for x in rec.read_text().splitlines()]
    calls = {x["test"].split("::")[1]: x for x in rows if x["when"] == "call"}
    assert calls["test_burns_in_a_child"]["cpu_s"] >= 0.5
    assert calls["test_sleeps"]["cpu_s"] < 0.3 <= calls["test_sleeps"]["wall_s"]
    assert {x["when"] for x in rows} == {"setup", "call", "teardown"}

    s = subprocess.run([sys.executable, str(REPO / "bench" / "test_cpu_times.py"), str(rec)],
                       capture_output=True, text=True, timeout=60)
    assert s.returncode == 0, s.stderr
    lines = s.stdout.splitlines()
    assert lines[0].startswith("2 tests, ")
    per_test = lines[lines.index(next(x for x in lines if x.endswith("(setup + call + teardown)")))
                     + 1]
    assert per_test.endswith("test_cases.py::test_burns_in_a_child"), s.stdout

    rec.write_text("not json\n")
    bad = subprocess.run([sys.executable, str(REPO / "bench" / "test_cpu_times.py"), str(rec)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and f"{rec}:1: not a JSON line" in bad.stderr
