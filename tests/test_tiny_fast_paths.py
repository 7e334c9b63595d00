"""The tiny run's CPU fast paths change no number: a short tiny run (FP32, and NVFP4 through the
emulation) gives bitwise the same losses, evaluations and final weights with them on and off
(tests/helpers/fast_path_probe.py): the model's forward and torch's optimizer step outside
cpu_compat's torch-function mode, the attention scores masked by one out-of-place torch.where,
the cross entropy's logits maximum by torch.amax, NVFP4
weights quantized once per step (precision.linear.WEIGHT_CACHE), and the NVFP4 row+column
quantization by the C kernel (precision/native.py). docs/training.md ("The tiny
benchmark") has the full-length runs compared with the logs of the code before the fast paths."""
import json
import subprocess
import sys

import pytest

from conftest import REPO, py_env

pytestmark = pytest.mark.slow
PROBE = REPO / "tests" / "helpers" / "fast_path_probe.py"
SHORT = {"run": {"division": "open", "max_steps": 4},
         "eval": {"first_step": 2, "interval_steps": 2, "samples": 8}}


def _probe(tiny_env, tmp_path, compute: str) -> dict:
    over = json.loads(json.dumps(SHORT))
    if compute == "nvfp4":
        over["precision"] = {"compute": "nvfp4", "nvfp4_rht": False,   # as tiny_cpu_nvfp4.toml
                             "nvfp4_stochastic_rounding": False, "nvfp4_2d_weights": False}
    out = tmp_path / f"fast_{compute}.json"
    r = subprocess.run([sys.executable, str(PROBE), str(tiny_env["config"]), json.dumps(over),
                        str(out)], cwd=REPO, env=py_env(), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("compute", ["fp32", "nvfp4"])
def test_fast_paths_leave_the_tiny_run_bitwise_unchanged(tiny_env, tmp_path, compute):
    rec = _probe(tiny_env, tmp_path, compute)
    on, off = rec["on"], rec["off"]
    assert on["reason"].startswith("target"), on["reason"]    # ran to max_steps
    assert len(on["losses"]) == 4 and [s for s, _ in on["evals"]] == [2, 4]
    # forward + optimizer step + the attention mask + the cross entropy's logits maximum
    assert on["switched"] == 4 and off["switched"] == 0
    if compute == "nvfp4":
        # 4 microbatches per step: the weights are quantized once, then reused
        assert on["weight_cache_hits"] > 0
        assert on["native"] and not off["native"]           # the C kernel, then torch's ops
    assert on["losses"] == off["losses"]                      # exact floats
    assert on["evals"] == off["evals"]
    assert on["weights_sha256"] == off["weights_sha256"]
