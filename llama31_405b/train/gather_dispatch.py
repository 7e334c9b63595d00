"""The DDP parameter all-gather's dispatch state, reset: shared by the training graph's capture
(train.graphs) and every evaluation (train.evaluation), which both must gather whatever came
before them."""
from __future__ import annotations


def reset(model) -> int:
    """Mark every DDP bucket group's parameter all-gather as not dispatched, so the next forward
    pre-hooks gather (megatron-core 0.19.2 `DistributedDataParallel.reset_param_sync_dispatch_state`).
    A gather still in flight is finished first (`start_param_sync(force_sync=True)` on its bucket
    group waits for it): the reset refuses to run over one. Returns the bucket groups reset."""
    n = 0
    for chunk in model if isinstance(model, list) else [model]:
        if not getattr(chunk, "use_forward_hook", False):
            continue                     # no overlapped gather: the optimizer step gathers
        groups = chunk.bucket_groups + chunk.expert_parallel_bucket_groups
        for group in groups:
            if group.param_gather_handle is not None:
                group.start_param_sync(force_sync=True)
        chunk.reset_param_sync_dispatch_state()
        n += len(groups)
    return n
