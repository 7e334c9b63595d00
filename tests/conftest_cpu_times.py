"""`--cpu-times FILE`: what each test costs in CPU, for keeping `make test` inside its budget.

A test's wall time depends on what else the machine runs (under `make test`'s three workers on two
cores a test can take twice its time alone), so the durations pytest prints cannot tell which
tests to move to `make test-stress`. The CPU seconds a test uses barely depend on load: this
records, per test phase (setup, call, teardown), its start (epoch seconds), the wall time and the
CPU time of the pytest process and of its children that ended in the phase
(`getrusage(RUSAGE_CHILDREN)`: the CLI subprocesses, torchrun and its ranks). Not counted: the Slurm job steps (slurmd's children) and
a fixture's processes still running. One JSON line per phase is appended to FILE (every xdist
worker appends to the same file; a line is one write). `bench/test_cpu_times.py FILE` sums them.
"""
from __future__ import annotations

import json
import os
import resource
import time

import pytest


def pytest_addoption(parser):
    parser.addoption("--cpu-times", metavar="FILE", default=None,
                     help="append each test phase's wall and CPU seconds to FILE (JSON lines)")


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _record(item, when: str):
    path = item.config.getoption("--cpu-times")
    if not path:
        yield
        return
    t0, w0, c0 = time.time(), time.monotonic(), _cpu()
    yield
    line = json.dumps(dict(test=item.nodeid, when=when, start=round(t0, 3),
                           wall_s=round(time.monotonic() - w0, 3),
                           cpu_s=round(_cpu() - c0, 3),
                           worker=os.environ.get("PYTEST_XDIST_WORKER", "main"))) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _record(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _record(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _record(item, "teardown")
