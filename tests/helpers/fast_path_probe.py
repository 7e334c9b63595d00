"""Two short tiny runs in one process, with the CPU fast paths of the tiny run on, then off
(cpu_compat.fast_paths a no-op: the model's forward and the optimizer step under the
torch-function mode, Megatron's own in-place attention mask and logits maximum in the cross
entropy, every NVFP4 weight quantized at every use, as before the fast paths existed, and the
row+column NVFP4 quantization in torch instead of the C kernel of precision/native.py), for
tests/test_tiny_fast_paths.py.

usage: python tests/helpers/fast_path_probe.py CONFIG OVERRIDES_JSON OUT_JSON
Writes {"on": run, "off": run}; a run: losses, evaluations, sha256 of the final weights, the
number of callables the fast paths switched, the NVFP4 weight-cache hits and whether the C
kernel was used.
"""
from __future__ import annotations

import hashlib
import json
import sys


def _run(cfg, *, fast: bool) -> dict:
    import torch

    from llama31_405b import cpu_compat
    from llama31_405b.precision import linear, native
    from llama31_405b.train.loop import Run
    from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy as vpce

    real_logits_max = vpce.__dict__["calculate_logits_max"]
    real_fast_paths, real_get = cpu_compat.fast_paths, linear.WEIGHT_CACHE.get
    switched, hits = [], [0]

    def fast_paths(model, optimizer):
        switched.append(real_fast_paths(model, optimizer))
        return switched[-1]

    def get(weight, key, make):
        made = []
        out = real_get(weight, key, lambda: made.append(1) or make())
        hits[0] += not made
        return out

    cpu_compat.fast_paths = fast_paths if fast else (lambda model, optimizer: 0)
    linear.WEIGHT_CACHE.get = get if fast else (lambda weight, key, make: make())
    native.ENABLED = fast
    try:
        run = Run(cfg, seed=1, hooks=[])
        run.execute()
    finally:
        cpu_compat.fast_paths, linear.WEIGHT_CACHE.get = real_fast_paths, real_get
        native.ENABLED = True
        vpce.calculate_logits_max = real_logits_max          # Megatron's own, for the next run
        linear.WEIGHT_CACHE.clear()
    h = hashlib.sha256()
    for k, v in sorted(run.model[0].state_dict().items()):
        if isinstance(v, torch.Tensor):
            h.update(k.encode())
            h.update(v.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return {"losses": run.state.losses, "evals": [[s, v] for s, _, v in run.state.evals],
            "status": run.state.status, "reason": run.state.reason,
            "weights_sha256": h.hexdigest(), "switched": sum(switched),
            "weight_cache_hits": hits[0], "native": fast and native.kernel() is not None}


def main() -> int:
    cfg_path, overrides, out_path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    from llama31_405b.config import load_config
    cfg = load_config(cfg_path, overrides=overrides)
    rec = {"on": _run(cfg, fast=True), "off": _run(cfg, fast=False)}
    with open(out_path, "w") as f:
        json.dump(rec, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
