"""The tiny benchmark end to end (the session's `tiny_runs`: 3 seeds through
`python -m llama31_405b train`): each run is continued pre-training that reaches the target after
dozens of steps, with a complete MLPerf log; the log passes the tiny compliance rules."""
import subprocess
import sys

import pytest

from conftest import REPO
from llama31_405b.mlperf.checker import RULESET
from llama31_405b.mlperf.log import load_run

pytestmark = [pytest.mark.slow, pytest.mark.converge]   # the tiny runs: `make test-stress`
TINY_RULES = REPO / "compliance" / "tiny_llama31.yaml"


def test_tiny_runs_converge_as_continued_pretraining(tiny_runs, tiny_env):
    from llama31_405b.config import load_config
    d = load_config(tiny_env["config"]).derived
    seeds = set()
    for log in tiny_runs:
        ev = load_run(log).events
        keys = [e.key for e in ev]
        for k in ("cache_clear", "init_start", "init_stop", "run_start", "run_stop",
                  "block_start", "block_stop", "eval_start", "eval_stop", "eval_accuracy"):
            assert k in keys, f"{log}: no {k}"
        assert keys.index("init_stop") < keys.index("run_start") < keys.index("run_stop")
        stop = [e for e in ev if e.key == "run_stop"][-1]
        assert stop.metadata["status"] == "success", f"{log}: {stop}"
        evals = [(e.metadata["step"], e.value) for e in ev if e.key == "eval_accuracy"]
        assert evals[0][0] == d.first_eval_step
        assert evals[0][1] > d.target, "the initial checkpoint must not already meet the target"
        assert evals[-1][1] <= d.target and all(v > d.target for _, v in evals[:-1])
        assert evals[-1][0] >= 100, "target reached too early to be a benchmark"
        assert [e.metadata["samples_count"] for e in ev if e.key == "eval_accuracy"] == [
            s * d.gbs for s, _ in evals]
        seeds.add([e.value for e in ev if e.key == "seed"][0])
        steps = [e for e in ev if e.key == "tracked_stats"]
        assert len(steps) == evals[-1][0]
    assert len(seeds) == len(tiny_runs)


def test_tiny_logs_pass_the_mlperf_checker_with_tiny_rules(tiny_runs):
    for log in tiny_runs:
        r = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage",
                            "training", "--ruleset", RULESET, "--config", str(TINY_RULES),
                            str(log)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "SUCCESS" in (r.stdout + r.stderr), r.stdout + r.stderr
