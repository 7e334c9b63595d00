"""Validation log perplexity over exactly eval_samples sequences, shared by all DP ranks.

Value = (sum of per-token cross entropy over every validation token) / (number of tokens), i.e.
the mean negative log-likelihood in nats (the MLPerf eval_accuracy of llama31_405b). Sums are
exchanged, not per-rank means, so the value does not depend on how the sequences are split.

`eval_batches` reads this rank's validation microbatches (after run_start only); the warm-up
passes synthetic microbatches of the same count and shapes (train.warmup) to `evaluate`.

Every evaluation (timed, warm-up, the CUDA-graph capture pass) scores the weights of its step,
and gathers them overlapped with its own forward passes (`GatherAhead`, below): the gather
dispatch state is reset first (the pass gathers whatever came before it), each model chunk's
parameter all-gather is dispatched ahead of that chunk's forward passes (the first chunk's
before the schedule starts), and the DDP forward pre-hooks only wait for them. The dispatches run
inside the schedule function that the evaluation graph captures, so every replay gathers too.
`sync_params` (a synchronous gather of everything before the pass) is what the evaluation did
before; bench/eval_gather.py times both.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Unpack, cast

import torch

from .batches import eval_microbatches, eval_shard
from .gather_dispatch import finish_in_flight, gathering, reset
from .step import global_sum, run_schedule

if TYPE_CHECKING:   # megatron.core is imported after the TE environment check (train.loop)
    from megatron.core.distributed import DistributedDataParallel

    from ..config.schema import Config
    from .protocols import ForwardBackward, Microbatch, Samples, ScheduleArgs


def eval_layout(cfg: Config, *, dp_rank: int, dp: int) -> tuple[range, int, int]:
    """(this rank's shard of the validation set, eval MBS, microbatch-count multiple)."""
    mbs = cfg.batch.eval_micro_batch_size or cfg.batch.micro_batch_size
    shard = eval_shard(cfg.derived.eval_samples, dp, dp_rank)
    multiple = cfg.parallel.pp if cfg.parallel.vp > 1 else 1
    return shard, mbs, multiple


def eval_batches(valid_ds: Samples, cfg: Config, *, dp_rank: int, dp: int) -> list[Microbatch]:
    shard, mbs, multiple = eval_layout(cfg, dp_rank=dp_rank, dp=dp)
    return eval_microbatches(valid_ds, shard=shard, mbs=mbs, multiple_of=multiple)


def _dispatch(chunk: DistributedDataParallel, *, whole: bool) -> None:
    """Start the asynchronous all-gather of `chunk`'s bucket groups not dispatched yet, in the
    order the forward pass uses them: all of them with `align_param_gather` (its pre-hooks pass
    `skip_next_bucket_dispatch=True` and only wait), else the head of the bucket chain, whose
    pre-hook dispatches the next one when it waits. megatron-core 0.19.2 DistributedDataParallel
    builds `bucket_groups` in reverse order of use (gradients are ready from the output back)
    and links `bucket_groups[i].next_param_gather_bucket_group = bucket_groups[i - 1]`: the last
    group is used first. Its own `start_param_sync` (the interleaved schedule's
    param_sync_func) walks the list forwards, so the first forward waits for the whole chunk's
    gather; here the groups go last to first, and the first forward waits for one bucket
    (tests/test_gather_dispatch_order.py records both orders; the planner counts Megatron's,
    planner.simulate.first_gather_s)."""
    for groups in (chunk.bucket_groups, chunk.expert_parallel_bucket_groups):
        for g in (groups[::-1] if whole else groups[-1:]):
            if not g.param_gather_dispatched:
                g.start_param_sync()


class GatherAhead:
    """A forward-only schedule function (megatron-core 0.19.2 `get_forward_backward_func()`'s, or
    `schedule`) whose pass gathers the parameters overlapped with itself: chunk 0's all-gather is
    dispatched before the schedule runs, chunk i+1's when chunk i's first forward starts (a
    forward pre-hook on chunk i), and the DDP pre-hooks wait for each bucket group when its first
    parameter is used. Megatron's forward-only schedules drop `config.param_sync_func`, which does
    this for training (`forward_backward_pipelining_with_interleaving`). Afterwards no gather is in
    flight. The caller resets the dispatch state first (`evaluate`); called with keyword
    arguments only, as the schedule function. Several gathers of one group are in flight at
    once, as in a training step: on gloo that needs one worker thread per group
    (gloo_workers)."""

    def __init__(self, schedule: ForwardBackward | None = None) -> None:
        self.schedule = schedule

    def __call__(self, **kwargs: Unpack[ScheduleArgs]) -> list[dict[str, torch.Tensor]] | None:
        schedule = self.schedule
        if schedule is None:
            from megatron.core.pipeline_parallel import get_forward_backward_func
            schedule = cast("ForwardBackward", get_forward_backward_func())   # unannotated
        chunks = gathering(kwargs["model"])
        if not chunks:
            return schedule(**kwargs)
        whole = chunks[0].ddp_config.align_param_gather
        _dispatch(chunks[0], whole=whole)
        hooks = [c.register_forward_pre_hook(lambda *_, nxt=nxt: _dispatch(nxt, whole=whole))
                 for c, nxt in zip(chunks, chunks[1:])]
        try:
            return schedule(**kwargs)
        finally:
            for h in hooks:
                h.remove()
            for c in chunks:
                finish_in_flight(c)             # a gather the pass did not use


def sync_params(model_chunks: list[DistributedDataParallel]) -> bool:
    """Make every DP rank's parameters those of the last optimizer step with one synchronous
    gather of everything: `DistributedDataParallel.start_param_sync(force_sync=True)` on every
    chunk, what Megatron-LM's `force_param_sync` (megatron/training/training.py) does before
    checkpointing and, with its pre-hooks disabled (`disable_forward_pre_hook(param_sync=True)`),
    before evaluating. Returns whether it gathered.

    Why an evaluation must gather at all (megatron-core 0.19.2): `DistributedOptimizer.
    step_with_ready_grads` writes only this rank's shard of the parameter buffer and leaves the
    all-gather to the DDP forward pre-hooks (`_ParamAndGradBucketGroup.finish_param_sync`, which
    gathers only while `param_gather_dispatched` is false); an evaluation never resets that flag
    (only `finish_grad_sync`, in a training step, does), the interleaved schedule drops
    `config.param_sync_func` for forward-only passes, and a CUDA-graph replay runs no Python. An
    evaluation graph captured after a pass that had gathered would hold no gather, and every
    timed evaluation would score this rank's shard at step k and the others' at step k-1.

    This was the evaluation's gather until `GatherAhead`, which gathers inside the pass, overlapped
    with it; the whole gather here is exposed. bench/eval_gather.py times both."""
    chunks = gathering(model_chunks)
    if not chunks:
        return False                    # no overlapped gather: the optimizer step gathered
    with torch.no_grad():
        for m in chunks:
            m.start_param_sync(force_sync=True)
    return True


def evaluate(model_chunks: list[DistributedDataParallel], microbatches: list[Microbatch],
             cfg: Config, *, last_stage: bool, tp_rank: int, gpu: bool,
             forward_only_fn: ForwardBackward | None = None) -> float:
    """Log perplexity of `microbatches` summed over all ranks, with the weights of the last
    optimizer step, gathered overlapped with the pass (`GatherAhead`). `forward_only_fn`
    replaces it (train.graphs: the evaluation CUDA graph, which wraps a GatherAhead)."""
    mbs = cfg.batch.eval_micro_batch_size or cfg.batch.micro_batch_size
    with torch.no_grad():
        reset(model_chunks)     # the pass gathers whatever came before it
    for m in model_chunks:
        m.eval()
    with torch.no_grad():
        local = run_schedule(model_chunks, microbatches, seq_length=cfg.model.seq_length,
                             mbs=mbs, forward_only=True, cp=cfg.parallel.cp, gpu=gpu,
                             forward_backward=forward_only_fn or GatherAhead())
    for m in model_chunks:
        m.train()
    total = global_sum(local, contributes=last_stage and tp_rank == 0, gpu=gpu)
    if total[1] <= 0:
        raise RuntimeError("evaluation saw no validation tokens")
    return float(total[0] / total[1])
