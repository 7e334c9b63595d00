"""Runs one short training on this rank (single process or under torchrun) and writes what
the parallel tests compare: per-step losses, evaluations (one before training) and a checksum of
the parameters of every DP replica.

usage: python tests/helpers/train_worker.py CONFIG OVERRIDES_JSON OUT_JSON
(tests/test_train_parallel.py runs it, and torchrun's ranks of it, through tests/helpers/zygote.py)
"""
from __future__ import annotations

import hashlib
import json
import sys


def main() -> int:
    cfg_path, overrides, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    import torch
    import torch.distributed as dist
    from llama31_405b.config import load_config
    from llama31_405b.train.hooks import Hook
    from llama31_405b.train.loop import Run

    cfg = load_config(cfg_path, overrides=overrides)
    record = {"losses": [], "evals": []}

    class Recorder(Hook):
        def on_init_stop(self, run):
            record["eval0"] = run.evaluate()   # the initial checkpoint, before any update

        def on_step_end(self, run, stats):
            record["losses"].append(stats.loss)

        def on_eval_end(self, run, step, value, eval_time_s):
            record["evals"].append([step, value])

    run = Run(cfg, seed=cfg.run.seed_base, hooks=[Recorder()], timeout_s=120)
    record["status"] = run.execute()
    from megatron.core import parallel_state as ps
    # checksum of this rank's parameters, compared across the DP group
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1).double() for m in run.model for p in m.parameters()])
        digest = torch.tensor([flat.sum().item(), (flat * flat).sum().item(),
                               float(int(hashlib.sha256(flat.float().numpy().tobytes()).hexdigest()[:12], 16))],
                              dtype=torch.float64)
    dp = ps.get_data_parallel_world_size()
    got = [torch.zeros_like(digest) for _ in range(dp)]
    dist.all_gather(got, digest, group=ps.get_data_parallel_group())
    record["dp_identical"] = all(torch.equal(g, got[0]) for g in got)
    flags = torch.tensor([1.0 if record["dp_identical"] else 0.0])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    record["dp_identical"] = bool(flags.item() == 1.0)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(record, f)
    # as `train` does: a process group left to interpreter exit can abort a rank in gloo's
    # teardown ("terminate called without an active exception"), seen once in a fresh-clone run
    from llama31_405b.parallel.setup import teardown_parallel
    teardown_parallel()
    return 0 if record["status"] in ("success", "aborted") else 1


if __name__ == "__main__":
    sys.exit(main())
