"""Validation log perplexity over exactly eval_samples sequences, shared by all DP ranks.

Value = (sum of per-token cross entropy over every validation token) / (number of tokens), i.e.
the mean negative log-likelihood in nats (the MLPerf eval_accuracy of llama31_405b). Sums are
exchanged, not per-rank means, so the value does not depend on how the sequences are split.

`eval_batches` reads this rank's validation microbatches (after run_start only); the warm-up
passes synthetic microbatches of the same count and shapes (train.warmup) to `evaluate`.

Every evaluation (timed, warm-up, the CUDA-graph capture pass) scores the weights of its step:
`sync_params` gathers the parameters first, outside any captured region (below).
"""
from __future__ import annotations

import torch

from .batches import eval_microbatches, eval_shard
from .step import global_sum, run_schedule


def eval_layout(cfg, *, dp_rank: int, dp: int) -> tuple[range, int, int]:
    """(this rank's shard of the validation set, eval MBS, microbatch-count multiple)."""
    mbs = cfg.batch.eval_micro_batch_size or cfg.batch.micro_batch_size
    shard = eval_shard(cfg.derived.eval_samples, dp, dp_rank)
    multiple = cfg.parallel.pp if cfg.parallel.vp > 1 else 1
    return shard, mbs, multiple


def eval_batches(valid_ds, cfg, *, dp_rank: int, dp: int) -> list[dict[str, torch.Tensor]]:
    shard, mbs, multiple = eval_layout(cfg, dp_rank=dp_rank, dp=dp)
    return eval_microbatches(valid_ds, shard=shard, mbs=mbs, multiple_of=multiple)


def sync_params(model_chunks) -> bool:
    """Make every DP rank's parameters those of the last optimizer step, synchronously, where
    the distributed optimizer overlaps the parameter all-gather with the next forward pass.
    Returns whether it gathered.

    Why (megatron-core 0.19.2): `DistributedOptimizer.step_with_ready_grads` writes only this
    rank's shard of the parameter buffer and leaves the all-gather to the DDP forward pre-hooks
    (`_ParamAndGradBucketGroup.finish_param_sync`, which gathers only while
    `param_gather_dispatched` is false). An evaluation never resets that flag (only
    `finish_grad_sync`, in a training step, does), the interleaved schedule drops
    `config.param_sync_func` for forward-only passes (`schedules.py`,
    `forward_backward_pipelining_with_interleaving`), and a CUDA-graph replay runs no Python
    hook at all. So the evaluation graph, captured after an eager pass that gathered, holds no
    gather: without this call every timed evaluation would see this rank's shard at step k and
    the others' at step k-1.

    How: `DistributedDataParallel.start_param_sync(force_sync=True)` on every chunk, what
    Megatron-LM's `force_param_sync` (megatron/training/training.py) does before checkpointing;
    before evaluating it disables the pre-hooks with the same synchronous gather
    (`disable_forward_pre_hook(param_sync=True)`) and re-enables them afterwards, which leaves the
    same state. Called before the schedule (and so outside `FullCudaGraphWrapper`'s capture).
    The optimizer's `prepare_model_params_for_param_sync`, which Megatron-LM calls first, only
    acts with `reuse_grad_buf_for_mxfp8_param_ag`, which this project never sets.

    State left for the next training step: every bucket group has `param_gather_dispatched`
    true and no gather in flight, so its forward pre-hooks wait for nothing and issue nothing:
    the parameters are already those of the last optimizer step, and no optimizer step comes
    between an evaluation and the next forward pass. That step's `finish_grad_sync` resets the
    flags, so the forward after the next optimizer step gathers again. With the interleaved
    schedule (`align_param_gather`) the schedule's `param_sync_func` re-dispatches each chunk's
    gather anyway (`start_param_sync` only asserts that none is in flight, which holds). A
    captured training graph replays the gathers it captured whatever the flags say."""
    chunks = [m for m in model_chunks if getattr(m, "use_forward_hook", False)]
    if not chunks:
        return False                    # no overlapped gather: the optimizer step gathered
    with torch.no_grad():
        for m in chunks:
            m.start_param_sync(force_sync=True)
    return True


def evaluate(model_chunks, microbatches, cfg, *, last_stage: bool, tp_rank: int, gpu: bool,
             forward_only_fn=None) -> float:
    """Log perplexity of `microbatches` summed over all ranks, with the weights of the last
    optimizer step (`sync_params`). `forward_only_fn` replaces Megatron's schedule function
    (train.graphs: the evaluation CUDA graph)."""
    mbs = cfg.batch.eval_micro_batch_size or cfg.batch.micro_batch_size
    sync_params(model_chunks)
    for m in model_chunks:
        m.eval()
    with torch.no_grad():
        local = run_schedule(model_chunks, microbatches, seq_length=cfg.model.seq_length,
                             mbs=mbs, forward_only=True, cp=cfg.parallel.cp, gpu=gpu,
                             forward_backward=forward_only_fn)
    for m in model_chunks:
        m.train()
    total = global_sum(local, contributes=last_stage and tp_rank == 0, gpu=gpu)
    if total[1] <= 0:
        raise RuntimeError("evaluation saw no validation tokens")
    return float(total[0] / total[1])
