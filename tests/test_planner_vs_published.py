"""bench/planner_vs_published.py's rows marked "fit" are the published point's own figures: the
fit reproduces them (the compute row is the inner pipeline rank's with that rank's own DP
slowdown, as `calibrate.solve` fits it; with the busiest rank's it read 0.734 s under model
revision 9)."""
from __future__ import annotations

import importlib.util

import pytest

from conftest import REPO


def test_the_rows_marked_fit_reproduce_the_published_point():
    s = importlib.util.spec_from_file_location("pvp", REPO / "bench" / "planner_vs_published.py")
    assert s and s.loader
    bench = importlib.util.module_from_spec(s)
    s.loader.exec_module(bench)
    fit = [r for r in bench.rows(None) if r["kind"] == "fit"]
    assert {r["figure"].split(",")[0].split(" (")[0] for r in fit} >= {
        "128 racks: step time at GBS 1024", "128 racks: compute per step",
        "128 racks: GEMM share of compute", "128 racks: FFN share of compute"}
    for r in fit:
        assert r["predicted"] == pytest.approx(r["published"], rel=1e-6), r["figure"]
