"""One short multi-rank run (under torchrun, gloo) with full-iteration CUDA graphs stood in for
by the replay double (tests/helpers/graph_double.py), from random weights. After every logged
evaluation it evaluates again, eagerly, after a forced synchronous parameter gather: the weights
of that step at the same layout. Rank 0 writes what the test compares, with every rank's DDP
settings and bucket counts.

usage: torchrun ... tests/helpers/eval_sync_worker.py CONFIG OVERRIDES_JSON OUT_JSON
(tests/test_train_eval_sync.py starts the ranks through tests/helpers/zygote.py)
"""
from __future__ import annotations

import dataclasses
import json
import sys


def _ddp_facts(run) -> dict:
    chunks = []
    for m in run.model:
        c = m.ddp_config
        chunks.append({
            "buckets": sum(len(b.buckets) for b in m.buffers),
            "bucket_groups": len(m.bucket_groups),
            "chained_gathers": sum(g.next_param_gather_bucket_group is not None
                                   for g in m.bucket_groups),
            "grad_dtype": str(m.buffers[0].grad_dtype), "param_dtype": str(m.buffers[0].param_dtype),
            "overlap_grad_reduce": c.overlap_grad_reduce,
            "overlap_param_gather": c.overlap_param_gather,
            "align_param_gather": c.align_param_gather,
            "use_distributed_optimizer": c.use_distributed_optimizer,
            "bucket_size": c.bucket_size,
            "forward_pre_hook": m.use_forward_hook,
        })
    t = run.model[0].config
    from megatron.core import parallel_state as ps

    from llama31_405b.gloo_workers import worker_threads
    threads = {"world": worker_threads(),
               "dp": worker_threads(ps.get_data_parallel_group(with_context_parallel=True))}
    return {"chunks": chunks, "gloo_threads": threads, "vp": t.virtual_pipeline_model_parallel_size,
            "account_for_embedding": t.account_for_embedding_in_pipeline_split,
            "account_for_loss": t.account_for_loss_in_pipeline_split,
            "layers": [len(getattr(getattr(m.module, "module", m.module), "decoder").layers)
                       for m in run.model]}


def _count_gathers(counts: dict) -> None:
    """Count, while counts["on"], the parameter gathers of the bucket groups: dispatched
    asynchronously (`start_param_sync()`), forced synchronously, and the forward pre-hook waits
    (`finish_param_sync`) that found their gather not yet dispatched (issued at the wait itself,
    not ahead)."""
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup as G
    start, finish = G.start_param_sync, G.finish_param_sync

    def start_param_sync(self, force_sync=False):
        if counts["on"]:
            counts["forced" if force_sync else "dispatched"] += 1
        return start(self, force_sync=force_sync)

    def finish_param_sync(self, skip_next_bucket_dispatch=False):
        if counts["on"]:
            counts["waits"] += 1
            counts["not_ahead"] += not self.param_gather_dispatched
        return finish(self, skip_next_bucket_dispatch=skip_next_bucket_dispatch)

    G.start_param_sync, G.finish_param_sync = start_param_sync, finish_param_sync


def main() -> int:
    cfg_path, overrides, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    import torch.distributed as dist

    import graph_double
    from llama31_405b.config import load_config
    from llama31_405b.train import evaluation
    from llama31_405b.train.hooks import Hook
    from llama31_405b.train.loop import Run

    cfg = load_config(cfg_path, overrides=overrides)
    # the config as validated, with full-iteration graphs: the double stands for them on CPU
    # (config validation refuses CUDA graphs on a CPU system)
    cfg = dataclasses.replace(cfg, performance=dataclasses.replace(
        cfg.performance, cuda_graphs="full_iteration"))
    graph_double.install()
    record = {"losses": [], "evals": []}
    counts = {"on": False, "dispatched": 0, "forced": 0, "waits": 0, "not_ahead": 0}
    _count_gathers(counts)

    class Compare(Hook):
        def on_eval_start(self, run, step):
            counts["on"] = True             # the logged evaluation's gathers only

        def on_eval_end(self, run, step, value, eval_time_s):
            counts["on"] = False
            for m in run.model:                       # the weights of this step, everywhere
                m.start_param_sync(force_sync=True)
            forced = evaluation.evaluate(
                run.model, evaluation.eval_batches(run.valid_ds, run.cfg, dp_rank=run.info.dp_rank,
                                                   dp=run.info.dp_size),
                run.cfg, last_stage=run.last_stage, tp_rank=run.info.tp_rank, gpu=False)
            record["evals"].append([step, value, forced])

        def on_step_end(self, run, stats):
            record["losses"].append(stats.loss)

    run = Run(cfg, seed=cfg.run.seed_base, hooks=[Compare()], timeout_s=120, init_checkpoint="")
    record["status"] = run.execute()
    record["reason"] = run.state.reason
    import megatron.core.full_cuda_graph as fcg
    record["captured"] = {k: g is not None for k, g in fcg.FullCudaGraphWrapper.cuda_graph.items()}
    record["capture_flags"] = graph_double.CAPTURES
    record["replays"] = graph_double.REPLAYS
    facts = _ddp_facts(run)
    facts["eval_gathers"] = {k: v for k, v in counts.items() if k != "on"}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, facts)
    record["ranks"] = every
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(record, f)
    from llama31_405b.parallel.setup import teardown_parallel
    teardown_parallel()
    return 0 if record["status"] in ("success", "aborted") else 1


if __name__ == "__main__":
    sys.exit(main())
