"""The DDP parameter all-gather's dispatch state: which chunks gather by it, finishing what is in
flight, and the reset shared by the training graph's capture (train.graphs) and every evaluation
(train.evaluation), which both must gather whatever came before them."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:   # megatron.core is imported after the TE environment check (train.loop)
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup


def gathering(model: DistributedDataParallel | list[DistributedDataParallel]
              ) -> list[DistributedDataParallel]:
    """The DDP chunks whose parameters arrive by the overlapped all-gather (the others' optimizer
    step gathers)."""
    chunks = model if isinstance(model, list) else [model]
    return [m for m in chunks if getattr(m, "use_forward_hook", False)]


def finish_in_flight(chunk: DistributedDataParallel) -> list[_ParamAndGradBucketGroup]:
    """Wait for every all-gather of `chunk` still in flight (`start_param_sync(force_sync=True)`
    on its bucket group waits for it); returns the chunk's bucket groups."""
    groups = chunk.bucket_groups + chunk.expert_parallel_bucket_groups
    for group in groups:
        # megatron-core 0.19.2 initialises the handle to None unannotated: read as `object`, so
        # that mypy does not take this branch for dead and checks it
        handle: object = group.param_gather_handle
        if handle is not None:
            group.start_param_sync(force_sync=True)
    return groups


def reset(model: DistributedDataParallel | list[DistributedDataParallel]) -> int:
    """Mark every DDP bucket group's parameter all-gather as not dispatched, so the next forward
    pre-hooks gather (megatron-core 0.19.2 `DistributedDataParallel.reset_param_sync_dispatch_state`).
    A gather still in flight is finished first: the reset never runs over one. Returns the
    bucket groups reset."""
    n = 0
    for chunk in gathering(model):
        n += len(finish_in_flight(chunk))
        chunk.reset_param_sync_dispatch_state()
    return n
