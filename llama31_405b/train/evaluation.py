"""Validation log perplexity over exactly eval_samples sequences, shared by all DP ranks.

Value = (sum of per-token cross entropy over every validation token) / (number of tokens), i.e.
the mean negative log-likelihood in nats (the MLPerf eval_accuracy of llama31_405b). Sums are
exchanged, not per-rank means, so the value does not depend on how the sequences are split.
"""
from __future__ import annotations

import torch

from .batches import eval_microbatches, eval_shard
from .step import global_sum, run_schedule


def evaluate(model_chunks, valid_ds, cfg, *, dp_rank: int, dp: int, last_stage: bool,
             tp_rank: int) -> float:
    d = cfg.derived
    mbs = cfg.batch.eval_micro_batch_size or cfg.batch.micro_batch_size
    shard = eval_shard(d.eval_samples, dp, dp_rank)
    multiple = cfg.parallel.pp if cfg.parallel.vp > 1 else 1
    mbs_list = eval_microbatches(valid_ds, shard=shard, mbs=mbs, multiple_of=multiple)
    for m in model_chunks:
        m.eval()
    with torch.no_grad():
        local = run_schedule(model_chunks, mbs_list, seq_length=cfg.model.seq_length, mbs=mbs,
                             forward_only=True, cp=cfg.parallel.cp)
    for m in model_chunks:
        m.train()
    total = global_sum(local, contributes=last_stage and tp_rank == 0)
    if total[1] <= 0:
        raise RuntimeError("evaluation saw no validation tokens")
    return float(total[0] / total[1])
