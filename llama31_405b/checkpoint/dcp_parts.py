"""Write a Megatron distributed checkpoint (torch_dist) in parts, then join the parts.

`megatron.core.dist_checkpointing.save` writes a whole sharded state dict at once, so every tensor
must be in memory together. For a 405B model (~810 GB) that is impossible on one host, and a
multi-rank save would need the whole model spread over many hosts' memory. Instead each part
holds a few tensors (here: one), is written by Megatron's own save (so the on-disk encoding,
keys and chunk layout are exactly Megatron's), and parts are joined afterwards: a torch_dist
checkpoint is a set of data files plus one `.metadata` (a pickled torch.distributed.checkpoint
Metadata mapping each key to its chunks and each chunk to a file, offset and length). Joining
moves the data files into the output directory under unique names and writes one `.metadata`
whose chunk lists are the union of the parts'. Nothing is re-encoded, so joining costs seconds.

A decoder tensor of layer i is saved as the chunk [i] of a [num_layers, ...] global tensor,
exactly like Megatron's prepended layer axis; loading at any PP/VP reads the chunks of its
layers, at any TP the rows/columns of its shard (torch DCP resharding).
"""
from __future__ import annotations

import dataclasses
import math
import os
import pickle
import shutil
from pathlib import Path

from .format import DCP_METADATA as METADATA, MEGATRON_CONFIG

PART_DONE = "part.done"
COMMON_STATE_PREFIX = "common_state"


class CheckpointJoinError(RuntimeError):
    """Parts do not form a complete, consistent checkpoint."""


def without_prepended_axes(sh_ten):
    """The same chunk as a plain ShardedTensor: data [1, ..., 1, *local] and no prepended axes.

    Megatron converts prepended-axis tensors through a path that assumes every chunk of the grid
    is present in the save call; a part has one layer, so the chunk is expressed with the layer
    axis as an ordinary dimension of size 1 instead. On disk the two are identical (same key,
    global shape, chunk offset and size), and Megatron loads it back with its prepended axes.
    """
    p = sh_ten.prepend_axis_num
    if not p:
        return sh_ten
    local = (1,) * p + tuple(sh_ten.local_shape)
    return dataclasses.replace(sh_ten, data=sh_ten.data.reshape(local), local_shape=local,
                               prepend_axis_num=0)


def save_part(sharded: dict, part_dir: Path) -> None:
    """Save `sharded` (ShardedTensors / ShardedObjects, no factories) with Megatron's torch_dist
    strategy into part_dir and mark it complete. Needs a (single-rank) process group."""
    from megatron.core import dist_checkpointing
    if part_dir.exists():
        shutil.rmtree(part_dir)          # a part interrupted mid-write is redone from scratch
    part_dir.mkdir(parents=True)
    items = {k: without_prepended_axes(v) if hasattr(v, "prepend_axis_num") else v
             for k, v in sharded.items()}
    # each part is a fragment of the global tensors, so Megatron's "every chunk saved exactly
    # once" check cannot pass per part; join() checks coverage of the whole checkpoint instead
    dist_checkpointing.save(items, str(part_dir), validate_access_integrity=False)
    tmp = part_dir / (PART_DONE + ".tmp")
    tmp.write_text("ok\n")
    os.replace(tmp, part_dir / PART_DONE)


def part_done(part_dir: Path) -> bool:
    return (part_dir / PART_DONE).is_file() and (part_dir / METADATA).is_file()


def _read_metadata(path: Path):
    with open(path / METADATA, "rb") as f:
        return pickle.load(f)


def _check_coverage(state_dict_metadata: dict) -> None:
    """Every tensor's chunks tile its global shape exactly (no gap, no overlap)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    for key, md in state_dict_metadata.items():
        if not isinstance(md, TensorStorageMetadata):
            continue
        total = math.prod(md.size)
        covered = sum(math.prod(c.sizes) for c in md.chunks)
        starts = {tuple(c.offsets) for c in md.chunks}
        if covered != total or len(starts) != len(md.chunks):
            raise CheckpointJoinError(
                f"tensor {key}: chunks cover {covered} of {total} elements "
                f"({len(md.chunks)} chunks, {len(starts)} distinct offsets); a part is missing "
                "or duplicated")


def join(part_dirs: list[Path], out_dir: Path) -> None:
    """Join complete parts into the torch_dist checkpoint out_dir (idempotent: a join that was
    interrupted is finished by running it again). `.metadata` is written last, atomically, so
    the checkpoint is not loadable until every file is in place."""
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
    out_dir.mkdir(parents=True, exist_ok=True)
    merged: dict = {}
    storage: dict = {}
    planner: dict = {}
    kept_common = False
    for idx, part in enumerate(part_dirs):
        if not part_done(part):
            raise CheckpointJoinError(f"{part}: part is not complete")
        md = _read_metadata(part)
        drop = set()
        for key, smd in md.state_dict_metadata.items():
            if key.startswith(COMMON_STATE_PREFIX):
                # every Megatron save carries the common (non-tensor) state; keep one copy
                if kept_common:
                    drop.add(key)
                    continue
                kept_common = True
            if key not in merged:
                merged[key] = smd
            elif isinstance(smd, TensorStorageMetadata):
                have = merged[key]
                if (tuple(have.size) != tuple(smd.size)
                        or have.properties.dtype != smd.properties.dtype):
                    raise CheckpointJoinError(
                        f"tensor {key}: part {part} has global shape {tuple(smd.size)} "
                        f"{smd.properties.dtype}, another part {tuple(have.size)} "
                        f"{have.properties.dtype}")
                have.chunks.extend(smd.chunks)
            else:
                raise CheckpointJoinError(f"object {key} is stored by two parts (second: {part})")
        if isinstance(md.planner_data, dict):
            planner.update({k: v for k, v in md.planner_data.items() if k not in drop})
        for index, info in md.storage_data.items():
            if index.fqn in drop:
                continue
            name = f"p{idx:05d}{info.relative_path}"
            src, dst = part / info.relative_path, out_dir / name
            if src.exists():
                os.replace(src, dst)
            elif not dst.exists():
                raise CheckpointJoinError(f"{src}: data file missing (and not yet moved to {dst})")
            storage[index] = dataclasses.replace(info, relative_path=name)
    _check_coverage(merged)
    first = part_dirs[0]
    shutil.copyfile(first / MEGATRON_CONFIG, out_dir / MEGATRON_CONFIG)
    meta = Metadata(state_dict_metadata=merged, planner_data=planner, storage_data=storage,
                    version=_read_metadata(first).version)
    tmp = out_dir / (METADATA + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out_dir / METADATA)
