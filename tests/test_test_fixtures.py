"""The shared test fixtures' own guards (tests/conftest.py): a failed tiny run is reported with
its stderr instead of handing its log to the tests, and a test that trains without the `slow`
marker (or a `stress` or `converge` test without it), and a test that reads the tiny runs without
the `converge` marker (so `make test` would train them), are caught at collection."""
import json
from types import SimpleNamespace

import pytest
from conftest import (misplaced_slurm_tests, tiny_run_failures, unmarked_converging_tests,
                      unmarked_stress_tests, unmarked_training_tests)


def test_a_failed_tiny_run_is_reported_with_its_stderr(tmp_path):
    logs = []
    for i, (rc, err) in enumerate([(0, ""), (1, "RuntimeError: loss is NaN at step 3")]):
        (tmp_path / f"result_{i}.json").write_text(json.dumps({"rc": rc, "seed": 7 + i,
                                                               "stderr": err}))
        logs.append(tmp_path / f"result_{i}.txt")
    failed = tiny_run_failures(logs)
    assert len(failed) == 1
    assert "result_1.txt: seed 8, exit status 1" in failed[0]
    assert "loss is NaN at step 3" in failed[0]


def _item(nodeid, fixtures, slow, stress=False, slurm=False, group=None, converge=False):
    marks = {"slow": pytest.mark.slow.mark if slow else None,
             "stress": pytest.mark.stress.mark if stress else None,
             "converge": pytest.mark.converge.mark if converge else None,
             "slurm": pytest.mark.slurm.mark if slurm else None,
             "xdist_group": pytest.mark.xdist_group(group).mark if group else None}
    return SimpleNamespace(nodeid=nodeid, fixturenames=fixtures,
                           get_closest_marker=lambda name: marks.get(name))


def test_training_fixtures_need_the_slow_marker():
    items = [_item("a", ["tiny_runs", "tmp_path"], slow=False),
             _item("b", ["tiny_env"], slow=True), _item("c", ["tmp_path"], slow=False)]
    assert unmarked_training_tests(items) == ["a"]


def test_stress_tests_need_the_slow_marker():
    items = [_item("a", ["tmp_path"], slow=False, stress=True),
             _item("b", ["tiny_env"], slow=True, stress=True), _item("c", [], slow=False)]
    assert unmarked_stress_tests(items) == ["a"]
    items = [_item("a", ["tiny_runs"], slow=False, converge=True),
             _item("b", ["tiny_runs"], slow=True, converge=True)]
    assert unmarked_stress_tests(items) == ["a"]


def test_tests_that_read_the_tiny_runs_need_the_converge_marker():
    items = [_item("a", ["tiny_runs", "tmp_path"], slow=True),
             _item("b", ["tiny_run_seeds", "tiny_env"], slow=True),
             _item("c", ["tiny_runs"], slow=True, converge=True),
             _item("d", ["tiny_env"], slow=True), _item("e", ["tmp_path"], slow=False)]
    assert unmarked_converging_tests(items) == ["a", "b"]


def test_slurm_tests_need_the_marker_and_the_xdist_group():
    items = [_item("a", ["slurm_cluster"], slow=True, slurm=True, group="slurm"),
             _item("b", ["slurm_cluster"], slow=True, slurm=True),
             _item("c", ["slurm_cluster"], slow=True, group="slurm"),
             _item("d", ["slurm_cluster"], slow=True, slurm=True, group="train_parallel"),
             _item("e", ["tmp_path"], slow=False)]
    assert misplaced_slurm_tests(items) == ["b", "c", "d"]
