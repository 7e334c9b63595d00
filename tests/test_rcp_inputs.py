"""The RCP decision and the RCP-file generator on logs that lack a header value: a clear answer
naming what is missing, not an error from deep inside (real published logs, one key dropped)."""
import pytest
from mlperf_logs import copy_logs, drop_key, need_fixture

from llama31_405b.mlperf.log import load_run
from llama31_405b.submission import rcp


def _runs(tmp_path, drop: str):
    need_fixture()
    paths = copy_logs(tmp_path)
    for p in paths:
        drop_key(p, drop)
    return [load_run(p) for p in paths]


def test_check_runs_without_a_benchmark_name_says_so(tmp_path):
    res = rcp.check_runs(_runs(tmp_path, "submission_benchmark"))
    assert not res.ok
    assert res.message == "Could not detect submission_benchmark"
    assert res.norm_factor == 1.0 and res.ref is None


def test_check_runs_without_a_batch_size_says_so(tmp_path):
    res = rcp.check_runs(_runs(tmp_path, "global_batch_size"))
    assert (res.ok, res.message) == (False, "Could not detect global_batch_size")


def test_rcp_records_refuse_a_run_without_a_batch_size_by_its_path(tmp_path):
    runs = _runs(tmp_path, "global_batch_size")
    with pytest.raises(ValueError, match=r"result_0\.txt: no global_batch_size logged"):
        rcp.rcp_records(runs, creator="t", when="w", platform="p", precision="NVFP4")
