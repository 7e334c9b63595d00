"""A checkpoint's tensors against the model that asks for them, before any tensor is read.

The record (`llama31_405b.json`, checkpoint.format) says which model a checkpoint holds; its shape
fields are compared with the config first. But the record is a small text file: copied from
another checkpoint, or edited, it can say "hidden_size 128" above tensors of width 256. Then
torch's reader fails deep inside the load with `torch.distributed.checkpoint.api.
CheckpointException` (a BaseException, not an Exception: it escapes `except Exception`), after
every rank has planned its reads. This module compares what each rank requests (the sharded
state dict: `ShardedTensor.key` and `.global_shape`, megatron-core 0.19.2
dist_checkpointing.mapping) with the sizes torch DCP recorded in the checkpoint's `.metadata`
(`FileSystemReader.read_metadata().state_dict_metadata[key].size`; megatron-core's torch_dist
strategy saves each ShardedTensor under its key at its global shape), and refuses the first
contradiction by name: tensor, both shapes, and what to do.

Skipped: tensors that may differ by design (`allow_shape_mismatch`, the padded vocabulary rows of
the embedding and output layer), flattened shards (distributed-optimizer state) and keys the
checkpoint does not hold (the load's own strict key check names those).
"""
from __future__ import annotations

from pathlib import Path


def _requested(sharded: dict):
    """Every ShardedTensor of a sharded state dict, factories (e.g. the SwiGLU fc1 split) built."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
    for v in nested_values(sharded):
        if isinstance(v, ShardedTensorFactory):
            yield from _requested(v.build())
        elif isinstance(v, ShardedTensor):
            yield v


def mismatches(sharded: dict, stored: dict) -> list[tuple[str, tuple, tuple]]:
    """(key, shape in the checkpoint, shape the model asks for) of every contradiction; `stored`:
    key -> torch DCP metadata (anything with `.size`)."""
    out, seen = [], set()
    for t in _requested(sharded):
        if t.key in seen or t.allow_shape_mismatch or t.flattened_range is not None:
            continue
        seen.add(t.key)
        meta = stored.get(t.key)
        size = getattr(meta, "size", None)
        if size is None:
            continue
        if tuple(size) != tuple(t.global_shape):
            out.append((t.key, tuple(size), tuple(t.global_shape)))
    return out


def _shape(s: tuple) -> str:
    return "[" + ", ".join(str(int(x)) for x in s) + "]"


def contradiction(sharded: dict, path: str | Path, source: str, record: str) -> str | None:
    """The refusal (tensor, both shapes, what to do) when a tensor of the checkpoint at `path`
    contradicts the model of config `source` although its record file `record` matched; None
    when every requested tensor fits. checkpoint.format raises it as its CheckpointError."""
    from torch.distributed.checkpoint import FileSystemReader
    stored = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    bad = mismatches(sharded, stored)
    if not bad:
        return None
    key, have, want = bad[0]
    more = f" (and {len(bad) - 1} more tensor(s))" if len(bad) > 1 else ""
    return (f"{path}: tensor {key} is {_shape(have)} in the checkpoint but {_shape(want)} in the "
            f"model of {source}{more}, although the checkpoint's record {record} matches the "
            "config: the record does not describe these tensors (copied or edited); convert or "
            "pre-train the checkpoint again for this model (docs/checkpoint.md)")
