"""A CPU test double for megatron-core 0.19.2's full-iteration CUDA graph wrapper
(`megatron.core.full_cuda_graph.FullCudaGraphWrapper`): CUDA-graph replay semantics without a GPU.

What a real replay does: it re-runs the kernels and collectives recorded during the capture call,
on whatever the captured buffers (parameters, gradient buffers, static inputs) hold now, and runs
no Python. A Python hook that issued a collective during the capture is therefore "replayed"; one
that decided to issue none (e.g. a DDP forward pre-hook that found the parameter all-gather
already dispatched) is replayed as doing nothing, whatever Python state says at replay time.

What the double does: calls before the capture index run eagerly, as the wrapper's do; the
capture call runs eagerly and records the Python state that decides which collectives the DDP
hooks issue: `param_gather_dispatched` of every bucket group of every model chunk
(`_ParamAndGradBucketGroup`; the forward pre-hook, `finish_param_sync`, gathers only where it is
false). Every later call ("replay") re-runs the schedule function on the wrapper's static buffers
with those flags set as at capture, copies the losses into the capture's result tensors (a replay
refreshes them in place), and puts back the flags it found (no Python ran). So:
- a graph captured after a pass that had gathered (every flag true) replays without any
  effective forward pre-hook: no gather, as on the GPU (what the evaluation graph did before
  train.evaluation reset the flags; what a training capture right after a forced gather did
  before train.graphs reset them);
- a graph captured with every flag false replays its gathers (and the gathers the schedule
  function dispatches itself, train.evaluation.GatherAhead, which reruns), and its backward
  hooks and gradient reduce-scatters run as the captured ones do.

What it cannot stand for: device-side effects (stream order, memory pools and addresses, a
kernel or collective that reads a stale pointer), host synchronisation forbidden inside a
capture, and any other Python state that changes what a capture records (only the DDP gather
flags are frozen; e.g. FP8 amax bookkeeping, RNG offsets and schedule branches re-run as Python
says at replay time). It reuses the wrapper's own static-buffer loading (`data_read`), counters
and class attributes, so `train.graphs.FullIterationGraphs` sees a wrapper with both graphs
"captured".

    import graph_double             # a worker script in tests/helpers/
    graph_double.install()          # before train.graphs builds its wrappers
"""
from __future__ import annotations

import torch

CAPTURES: dict[str, list[bool]] = {}
"""Stage ("training", "validation") -> the gather flags recorded at its capture (tests read it)."""
REPLAYS = {"training": 0, "validation": 0}


def _chunks(model) -> list:
    return model if isinstance(model, list) else [model]


def _bucket_groups(model) -> list:
    return [g for m in _chunks(model)
            for g in getattr(m, "bucket_groups", []) + getattr(m, "expert_parallel_bucket_groups", [])]


def _flags(model) -> list[bool]:
    return [g.param_gather_dispatched for g in _bucket_groups(model)]


def _set_flags(model, flags: list[bool]) -> None:
    groups = _bucket_groups(model)
    assert len(groups) == len(flags), "the model's bucket groups changed since the capture"
    for g, f in zip(groups, flags):
        assert g.param_gather_handle is None, "a parameter gather is in flight at a replay"
        g.param_gather_dispatched = f


def _copy_into(dst, src) -> None:
    """Refresh the capture's result tensors in place (what a replay does to its outputs)."""
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, dict):
        for k in dst:
            _copy_into(dst[k], src[k])
    elif isinstance(dst, (list, tuple)):
        assert len(dst) == len(src)
        for a, b in zip(dst, src):
            _copy_into(a, b)


def make_double():
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper

    class ReplayDouble(FullCudaGraphWrapper):
        """FullCudaGraphWrapper with replays re-run as Python-frozen reruns (module docstring)."""

        def __call__(self, *args, **kwargs):
            assert not args, "forward_backward_func does not accept positional args"
            cls = type(self)
            model = kwargs["model"]
            training = not kwargs["forward_only"]
            stage = "training" if training else "validation"
            kwargs["data_iterator"] = self.data_read(kwargs["data_iterator"], model, training,
                                                     kwargs["num_microbatches"])
            it = cls.curr_iteration[stage]
            if it == self.cuda_graph_warmup_steps:
                assert cls.cuda_graph[stage] is None
                CAPTURES[stage] = _flags(model)
                cls.cuda_graph[stage] = f"replay double ({stage})"
                cls.result[stage] = self.forward_backward_func(*args, **kwargs)
            elif cls.cuda_graph[stage] is None:
                cls.result[stage] = self.forward_backward_func(*args, **kwargs)
            else:
                found = _flags(model)
                _set_flags(model, CAPTURES[stage])
                try:
                    out = self.forward_backward_func(*args, **kwargs)
                finally:
                    _set_flags(model, found)
                _copy_into(cls.result[stage], out)
                REPLAYS[stage] += 1
            cls.curr_iteration[stage] = it + 1
            return cls.result[stage]

    return ReplayDouble


def install():
    """Replace megatron's FullCudaGraphWrapper by the double (train.graphs imports it when it
    builds the wrappers); returns the double's class."""
    import megatron.core.full_cuda_graph as fcg
    double = make_double()
    fcg.FullCudaGraphWrapper = double
    return double
