"""One worker thread per gloo process group (the CPU path).

torch 2.13's `ProcessGroupGloo`, built as `torch.distributed` builds it (`_new_process_group_helper`
passes no options), runs a group's queued collectives on two worker threads (`threads = 2 x
devices`, one device), both on the group's one gloo context. Two asynchronous collectives of one
group then run at the same time, and gloo's tcp transport corrupts the heap doing so: a 4-rank
script with nothing but megatron-core's pattern (several `_coalescing_manager` all-gathers of one
data-parallel group dispatched with `async_op=True`, then waited for) aborts with
`malloc(): unaligned tcache chunk detected` or a segmentation fault in a gloo worker thread
(`gloo::transport::tcp::UnboundBuffer::~UnboundBuffer` from `AsyncAllgatherCoalescedWork`, the
group's other worker thread inside `gloo::allgather`) in about half of its 3,000-iteration runs;
with one worker thread, none (docs/training.md, "The evaluation's parameter gather on gloo").

The overlapped parameter gather of the distributed optimizer does exactly that on every training
step (megatron-core 0.19.2 `forward_backward_pipelining_with_interleaving` dispatches every bucket
group of the first two chunks through `param_sync_func`) and every evaluation
(`train.evaluation.GatherAhead`). With one worker thread a group's collectives still run
asynchronously to the caller, one after another in the order they were issued, which is the same
on every rank; different groups keep their own threads. NCCL (the GPU path) is not affected.

`apply()` is called by `cpu_compat.apply` on a CPU decision, before `init_process_group`.
"""
from __future__ import annotations

import os
from typing import Any

THREADS = 1
_applied = False


def apply() -> bool:
    """Make every gloo process group created from now on in this process run one worker
    thread. Idempotent; returns True once applied."""
    global _applied
    if _applied:
        return True
    import torch.distributed.distributed_c10d as c10d
    base: Any = c10d.ProcessGroupGloo     # torch's pybind11 class (its stubs lack _Options)

    class OneWorkerGloo(base):
        """`ProcessGroupGloo(store, rank, size, timeout=...)` as torch calls it, with the
        options its Python constructor would build (the default device, or one per interface
        named in GLOO_SOCKET_IFNAME) but `THREADS` worker threads."""

        def __init__(self, store, rank, size, timeout=None):
            opts = base._Options()
            if timeout is not None:
                opts._timeout = timeout
            names = [n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
            opts._devices = ([base.create_device(interface=n) for n in names] if names
                             else [base.create_default_device()])
            opts._threads = THREADS
            super().__init__(store, rank, size, opts)

    setattr(c10d, "ProcessGroupGloo", OneWorkerGloo)   # read by _new_process_group_helper
    _applied = True
    return True


def worker_threads(group=None) -> int:
    """The worker threads of `group`'s gloo backend (the default group if None)."""
    import torch
    import torch.distributed as dist
    pg: Any = group if group is not None else dist.group.WORLD
    return int(pg._get_backend(torch.device("cpu")).options._threads)
