"""The types the training loop's pieces hand each other, for the type check (make typecheck):
a microbatch, a dataset as the loop reads it, and the pipeline schedule function's call.

megatron-core 0.19.2's `get_forward_backward_func()` has no return annotation, and its schedule
functions (`forward_backward_no_pipelining`, `forward_backward_pipelining_with_interleaving`,
...) take keyword arguments only; `ForwardBackward` is that call as the project makes it
(train.step.run_schedule), so what wraps or replaces the schedule (train.graphs, the
evaluation's `GatherAhead`, megatron-core's `FullCudaGraphWrapper`) is checked against one
signature. Nothing here runs: the module holds declarations only.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypedDict, Unpack

import torch

if TYPE_CHECKING:   # megatron.core is imported after the TE environment check (train.loop)
    from megatron.core.distributed import DistributedDataParallel

Microbatch: TypeAlias = dict[str, torch.Tensor]
"""One microbatch: train.batches.KEYS -> a [MBS, seq] tensor."""

LossReport: TypeAlias = tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]
"""What a loss function gives Megatron's schedule: (loss sum, token count, {name: report})."""


class Samples(Protocol):
    """A dataset as the loop reads it: a sample by its index (megatron-core's BlendedDataset and
    GPTDataset, data.datasets.PackedValidationDataset), each a mapping of train.batches.KEYS to
    an array or tensor."""

    def __getitem__(self, idx: int, /) -> Mapping[str, object]: ...


class ScheduleArgs(TypedDict):
    """The keyword arguments of a pipeline schedule call (train.step.run_schedule)."""
    forward_step_func: Callable[[Iterator[Microbatch], DistributedDataParallel],
                                tuple[torch.Tensor, Callable[[torch.Tensor], LossReport]]]
    data_iterator: Iterator[Microbatch] | list[Iterator[Microbatch]]
    model: DistributedDataParallel | list[DistributedDataParallel]
    num_microbatches: int
    seq_length: int
    micro_batch_size: int
    forward_only: bool


class ForwardBackward(Protocol):
    """A pipeline schedule function (megatron-core 0.19.2 `get_forward_backward_func()`'s), or
    what stands in for it: keyword arguments only; the loss reports of the last pipeline stage's
    microbatches (an empty list or None elsewhere)."""

    def __call__(self, **kwargs: Unpack[ScheduleArgs]) -> list[dict[str, torch.Tensor]] | None:
        ...
