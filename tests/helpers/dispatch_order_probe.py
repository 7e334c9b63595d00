"""One process (gloo, world size 1) with a real megatron-core DDP chunk of the tiny GB200 settings
(distributed optimizer, overlapped parameter gather, a bucket small enough for several bucket
groups): which bucket groups `train.evaluation._dispatch` starts and in what order, and the order
in which the chunk's forward pass first uses them (the DDP forward pre-hooks wait on each group
with `finish_param_sync`). Prints one JSON line. With `--megatron`, megatron-core's own
`DistributedDataParallel.start_param_sync` (the interleaved schedule's param_sync_func) is
recorded instead of `_dispatch`.

usage: python tests/helpers/dispatch_order_probe.py CONFIG [--megatron]
(tests/test_gather_dispatch_order.py)
"""
from __future__ import annotations

import json
import os
import sys


def main() -> int:
    config, megatron_order = sys.argv[1], "--megatron" in sys.argv[2:]
    import torch
    import torch.distributed as dist

    from llama31_405b import cpu_compat
    cpu_compat.apply()
    from llama31_405b.config import load_config
    cfg = load_config(config, overrides={
        "parallel": {"pp": 1, "vp": 1}, "system": {"racks": 1, "gpus_per_rack": 1},
        "batch": {"minibs": 2}, "precision": {"compute": "bf16"}}, validate=False)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", sys.argv[sys.argv.index("--port") + 1]
                          if "--port" in sys.argv else "29591")
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup as G

    from llama31_405b.model.builder import build_model, wrap_for_training
    from llama31_405b.parallel.setup import megatron_parallel_kwargs
    from llama31_405b.systems.device import CPU
    from llama31_405b.train import evaluation
    from llama31_405b.train.gather_dispatch import reset
    ps.initialize_model_parallel(**megatron_parallel_kwargs(cfg))
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    model_parallel_cuda_manual_seed(1234)
    chunk = wrap_for_training(cfg, build_model(cfg, device=CPU))[0]
    ids = {id(g): i for i, g in enumerate(chunk.bucket_groups)}
    started, used = [], []
    start, finish = G.start_param_sync, G.finish_param_sync

    def start_param_sync(self, force_sync=False):
        started.append(ids[id(self)])
        return start(self, force_sync=force_sync)

    def finish_param_sync(self, skip_next_bucket_dispatch=False):
        if ids[id(self)] not in used:
            used.append(ids[id(self)])
        return finish(self, skip_next_bucket_dispatch=skip_next_bucket_dispatch)

    G.start_param_sync, G.finish_param_sync = start_param_sync, finish_param_sync
    reset([chunk])
    if megatron_order:
        chunk.start_param_sync()
    else:
        evaluation._dispatch(chunk, whole=True)
    tokens = torch.randint(0, 100, (1, cfg.model.seq_length))
    pos = torch.arange(cfg.model.seq_length).unsqueeze(0)
    with torch.no_grad():
        chunk(tokens, pos, None)
    print(json.dumps({"bucket_groups": len(chunk.bucket_groups), "dispatched": started,
                      "used": used}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
