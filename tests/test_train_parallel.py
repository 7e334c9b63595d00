"""Multi-rank gloo runs of the tiny model (4 processes) against one process, FP32:
loss curves and evaluations within 1e-4, DP replicas bitwise identical, evaluation over 63
sequences (not divisible by DP 2) equal to the single-process value, and the first evaluation of
the initial checkpoint equal at TP1 and TP2."""
import json
from pathlib import Path

import pytest

from helpers import zygote

# one xdist worker for the module (with --dist loadgroup): the reference run is made once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("train_parallel")]
WORKER = Path(__file__).parent / "helpers" / "train_worker.py"
COMMON = {"run": {"division": "open", "max_steps": 6},
          "eval": {"first_step": 3, "interval_steps": 3, "samples": 63, "target": 1.0},
          "batch": {"eval_micro_batch_size": 2}}
LAYOUTS = {
    "tp2_pp2": {"parallel": {"tp": 2, "pp": 2}, "system": {"gpus_per_rack": 4},
                "batch": {"minibs": 8, "micro_batch_size": 2}},
    "tp2_dp2": {"parallel": {"tp": 2}, "system": {"gpus_per_rack": 4},
                "batch": {"minibs": 4, "micro_batch_size": 2}},
    "pp2_vp2_dp2": {"parallel": {"pp": 2, "vp": 2}, "system": {"gpus_per_rack": 4},
                    "batch": {"minibs": 4, "micro_batch_size": 1}},
}


def _merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def run_worker(config, overrides, out: Path, nproc: int) -> dict:
    # `python WORKER ...` (nproc 1) or `torchrun --nproc_per_node=nproc WORKER ...`, its ranks
    # forked from the preloaded zygote (tests/helpers/zygote.py: the ranks' environment as
    # torchrun's; the launcher itself is tested by test_train_failure.py and test_launch.py)
    r = zygote.run_script(WORKER, [config, json.dumps(overrides), out], nproc, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def reference(tiny_env, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "ref.json"
    overrides = _merge(COMMON, {"batch": {"minibs": 8, "micro_batch_size": 2}})
    return run_worker(tiny_env["config"], overrides, out, 1)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_process(name, reference, tiny_env, tmp_path):
    got = run_worker(tiny_env["config"], _merge(COMMON, LAYOUTS[name]), tmp_path / "r.json", 4)
    assert len(got["losses"]) == len(reference["losses"]) == 6
    for a, b in zip(got["losses"], reference["losses"]):
        assert abs(a - b) < 1e-4, (got["losses"], reference["losses"])
    assert [s for s, _ in got["evals"]] == [s for s, _ in reference["evals"]] == [3, 6]
    for (_, a), (_, b) in zip(got["evals"], reference["evals"]):
        assert abs(a - b) < 1e-4, (got["evals"], reference["evals"])
    # first evaluation of the initial checkpoint, before any update (TP1 vs TP2 for tp2_*)
    assert abs(got["eval0"] - reference["eval0"]) < 1e-4
    assert got["dp_identical"], "data-parallel replicas diverged"
    # the run really learned something in 6 steps from the checkpoint
    assert reference["evals"][-1][1] < reference["eval0"]


def test_warmup_iterations_leave_the_run_unchanged(reference, tiny_env, tmp_path):
    """run.warmup_iters (before run_start) must not move weights, optimizer state, RNG or data."""
    over = _merge(COMMON, {"batch": {"minibs": 8, "micro_batch_size": 2},
                           "run": {"warmup_iters": 2}})
    got = run_worker(tiny_env["config"], over, tmp_path / "w.json", 1)
    assert got["losses"] == reference["losses"]
    assert got["evals"] == reference["evals"]
