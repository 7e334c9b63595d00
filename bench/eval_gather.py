"""The evaluation's parameter all-gather, exposed: before (one synchronous gather of everything,
then the pass: `train.evaluation.sync_params`) and after (the gathers dispatched ahead inside the
pass, each chunk's before its forward passes: `train.evaluation.GatherAhead`), both measured in
the same run, alternating, each right after a training step (so every gather has new shards).

configs/tiny_cpu_gb200.toml (PP2 x VP2 x DP2, distributed optimizer, overlapped and aligned
gather) on 4 gloo ranks under torchrun, random weights, synthetic tokens. Exposed gather time =
wall time inside the bucket groups' gather calls on the evaluating rank (the synchronous gather,
the dispatches and the forward pre-hooks' waits); the evaluation's wall time beside it. Prints
rank 0's medians and the after/before ratios. On a shared 2-core machine the gloo threads and 4
ranks compete for the cores: read the ratios, not the seconds.

Each gloo group runs one worker thread (llama31_405b.gloo_workers; printed): with torch's
two, 2 of 12 runs of this bench aborted on heap corruption inside gloo (bench/gloo_async_gather.py
reproduces it without a model; docs/training.md).

    PYTHONPATH=$PWD .venv/bin/python bench/eval_gather.py [--evals 6] [--samples 64]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "tiny_cpu_gb200.toml"


def _timed_gathers(acc: dict) -> None:
    """Accumulate into acc["s"] the wall time spent in the bucket groups' gather calls."""
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup as G
    start, finish = G.start_param_sync, G.finish_param_sync

    def start_param_sync(self, force_sync=False):
        t0 = time.perf_counter()
        try:
            return start(self, force_sync=force_sync)
        finally:
            acc["s"] += time.perf_counter() - t0

    def finish_param_sync(self, skip_next_bucket_dispatch=False):
        t0 = time.perf_counter()
        try:
            return finish(self, skip_next_bucket_dispatch=skip_next_bucket_dispatch)
        finally:
            acc["s"] += time.perf_counter() - t0

    G.start_param_sync, G.finish_param_sync = start_param_sync, finish_param_sync


def worker(evals: int, samples: int, out: str) -> int:
    import dataclasses

    import torch
    import torch.distributed as dist

    from llama31_405b.config import load_config
    from llama31_405b.train import evaluation
    from llama31_405b.train.batches import eval_microbatch_count, synthetic_microbatches
    from llama31_405b.first_contact.slice import synthetic_datasets
    from llama31_405b.train.loop import Run
    from llama31_405b.train.step import global_sum, run_schedule
    cfg = load_config(CONFIG, overrides={"run": {"division": "open", "max_steps": 2 * evals + 2},
                                         "eval": {"samples": samples}})
    run = Run(cfg, seed=1, hooks=[], timeout_s=300, init_checkpoint="",
              datasets=synthetic_datasets(cfg))
    acc = {"s": 0.0}
    _timed_gathers(acc)
    run._init()
    shard, mbs, multiple = evaluation.eval_layout(cfg, dp_rank=run.info.dp_rank,
                                                  dp=run.info.dp_size)
    batch = synthetic_microbatches(eval_microbatch_count(len(shard), mbs, multiple), mbs=mbs,
                                   seed=5, seq_length=cfg.model.seq_length,
                                   vocab_size=cfg.model.vocab_size)

    def before():        # evaluate() as it was: the synchronous gather, then the plain pass
        evaluation.sync_params(run.model)
        for m in run.model:
            m.eval()
        with torch.no_grad():
            local = run_schedule(run.model, batch, seq_length=cfg.model.seq_length, mbs=mbs,
                                 forward_only=True, gpu=False)
        for m in run.model:
            m.train()
        global_sum(local, contributes=run.last_stage, gpu=False)

    def after():
        evaluation.evaluate(run.model, batch, cfg, last_stage=run.last_stage, tp_rank=0,
                            gpu=False)

    got = {"before": [], "after": []}
    run.train_step()
    for i in range(2 * evals):
        name, fn = (("before", before), ("after", after))[i % 2]
        run.train_step()                          # new shards to gather
        dist.barrier()
        acc["s"] = 0.0
        t0 = time.perf_counter()
        fn()
        got[name].append((acc["s"], time.perf_counter() - t0))
    run.close()
    if dist.get_rank() == 0:
        from megatron.core import parallel_state as ps

        from llama31_405b import gloo_workers
        got["gloo_threads"] = gloo_workers.worker_threads(
            ps.get_data_parallel_group(with_context_parallel=True))
        Path(out).write_text(json.dumps(got))
    from llama31_405b.parallel.setup import teardown_parallel
    teardown_parallel()
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--evals", type=int, default=6, help="evaluations of each kind")
    ap.add_argument("--samples", type=int, default=64, help="validation sequences per evaluation")
    ap.add_argument("--worker", nargs=3, metavar=("EVALS", "SAMPLES", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        sys.exit(worker(int(a.worker[0]), int(a.worker[1]), a.worker[2]))
    import tempfile
    out = Path(tempfile.mkdtemp(prefix="eval_gather_")) / "out.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4",
                        f"--master_port={port}", "--master_addr=127.0.0.1", __file__, "--worker",
                        str(a.evals), str(a.samples), str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    if r.returncode:
        log = out.with_name("stderr.log")
        log.write_text(r.stderr)
        sys.exit(f"the ranks failed ({r.returncode}; all of stderr in {log}):\n{r.stderr[-4000:]}")
    got = json.loads(out.read_text())
    threads = got.pop("gloo_threads")
    print(f"configs/tiny_cpu_gb200.toml, 4 gloo ranks, {a.samples} validation sequences, "
          f"{a.evals} evaluations of each kind (rank 0, medians; load average "
          f"{os.getloadavg()[0]:.1f}; gloo worker threads per group: {threads})")
    med = {k: (median(g for g, _ in v), median(t for _, t in v)) for k, v in got.items()}
    for k, (g, t) in med.items():
        print(f"  {k:6s}  exposed gather {g * 1e3:8.1f} ms   evaluation {t * 1e3:8.1f} ms")
    (gb, tb), (ga, ta) = med["before"], med["after"]
    print(f"  after/before: exposed gather {ga / gb:.2f}, evaluation {ta / tb:.2f}")


if __name__ == "__main__":
    main()
