"""The shared test fixtures' own guards (tests/conftest.py): a failed tiny run is reported with
its stderr instead of handing its log to the tests, and a test that trains without the `slow`
marker is caught at collection."""
import json
from types import SimpleNamespace

import pytest
from conftest import tiny_run_failures, unmarked_training_tests


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


def _item(nodeid, fixtures, slow):
    mark = pytest.mark.slow.mark if slow else None
    return SimpleNamespace(nodeid=nodeid, fixturenames=fixtures,
                           get_closest_marker=lambda name: mark if name == "slow" else None)


def test_training_fixtures_need_the_slow_marker():
    items = [_item("a", ["tiny_runs", "tmp_path"], slow=False),
             _item("b", ["tiny_env"], slow=True), _item("c", ["tmp_path"], slow=False)]
    assert unmarked_training_tests(items) == ["a"]
