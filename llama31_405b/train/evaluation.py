"""Validation log perplexity over exactly eval_samples sequences, shared by all DP ranks.

Value = (sum of per-token cross entropy over every validation token) / (number of tokens), i.e.
the mean negative log-likelihood in nats (the MLPerf eval_accuracy of llama31_405b). Sums are
exchanged, not per-rank means, so the value does not depend on how the sequences are split.

`eval_batches` reads this rank's validation microbatches (after run_start only); the warm-up
passes synthetic microbatches of the same count and shapes (train.warmup) to `evaluate`.
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


def evaluate(model_chunks, microbatches, cfg, *, last_stage: bool, tp_rank: int, gpu: bool,
             forward_only_fn=None) -> float:
    """Log perplexity of `microbatches` summed over all ranks. `forward_only_fn` replaces
    Megatron's schedule function (train.graphs: the evaluation CUDA graph)."""
    mbs = cfg.batch.eval_micro_batch_size or cfg.batch.micro_batch_size
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
