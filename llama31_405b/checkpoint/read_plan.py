"""How many bytes each rank reads from the initial checkpoint, computed from the model's sharded
state dict without reading any (the rehearsal's figure; docs/checkpoint.md, docs/rehearsal.md).

Three facts decide it:

- what torch.distributed.checkpoint reads: `FileSystemReader.read_data` reads every stored chunk
  a request overlaps whole (`_StorageInfo.length` bytes, then `torch.load` and a narrow), so a
  rank pays for the stored chunks, not for its slice of them;
- how the checkpoint is chunked (checkpoint.chunking): `checkpoint convert` stores each tensor
  split as megatron-core requests it at the config's TP (so a request of that TP overlaps one
  chunk of its own size), or with `--chunks-tp 1` in whole layers (SwiGLU's gate and up halves
  apart, embedding and output layer at the true vocab rows), where a request of any TP shard
  costs the whole layer of that tensor;
- who reads: `checkpoint.format.load_strategy` (megatron-core 0.19.2 FullyParallelLoadStrategyWrapper
  over the DP x CP group) gives each shard of the group's slice to one rank, by megatron-core's
  own greedy assignment (`exchange_utils.distribute_shards_to_ranks`, by shard size); before it,
  every rank read its whole slice, and the warm-up restore read it again.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .chunking import SPLIT_AXIS, Chunking


@dataclass
class RankRead:
    chunk_tp: int
    """The checkpoint's chunking these figures are for: stored as at TP `chunk_tp` (1: whole
    layers)."""
    slice_bytes: int
    """Stored bytes behind this rank's TP x PP slice: what one plain load reads on this rank."""
    before_bytes: int
    """Before the parallel load: the slice at init and again at the warm-up restore."""
    after_bytes: int
    """Now: the stored chunks megatron-core assigns to this rank of its DP x CP group."""
    largest_chunk: int
    shards: int
    group_size: int
    stage_bytes: int
    """What the DP x CP groups of every TP rank of this rank's pipeline stage read together
    (each reads its slice once): the stage's part of the job's total."""
    stage_checkpoint_bytes: int
    """The stored bytes of the stage's layers: its part of the checkpoint."""

    def as_dict(self) -> dict:
        return asdict(self)


def _shard_tensors(chunks) -> list:
    """The ShardedTensors a load of `chunks` requests: factories applied (SwiGLU's fc1 split),
    extra states left out, as checkpoint.format.load does."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories

    from .format import drop_extra_states, sharded_state
    sharded = sharded_state(chunks)
    drop_extra_states(sharded)
    apply_factories(sharded)
    return [v for v in nested_values(sharded) if isinstance(v, ShardedTensor)]


def stored_bytes(sh, chunking: Chunking, *, vocab_size: int, tp: int, tp_rank: int | None = None
                 ) -> int:
    """Bytes of the stored chunks behind request `sh` (a ShardedTensor of a run at TP `tp`) in a
    checkpoint chunked by `chunking`; with `tp_rank`, behind the same request of that TP rank
    instead (the shard moved along the TP-split axis). The vocab axis of the tensors Megatron
    marks `allow_shape_mismatch` (embedding, output layer) is stored at the true vocab rows."""
    import torch
    p = sh.prepend_axis_num
    shape = list(sh.global_shape[p:])
    offset = list(sh.global_offset[p:])
    size = list(sh.local_shape)
    if sh.allow_shape_mismatch and shape:
        shape[0] = min(shape[0], vocab_size)
    axis = SPLIT_AXIS.get(sh.key)
    if tp_rank is not None and axis is not None and tp > 1:
        own = (offset[axis] // size[axis]) % tp
        offset[axis] += (tp_rank - own) * size[axis]
    elem = torch.tensor([], dtype=sh.dtype).element_size()
    return chunking.read_bytes(sh.key, shape, offset, size, elem)


def rank_read(chunks, cfg, *, group_size: int, group_rank: int,
              chunking: Chunking | None = None) -> RankRead:
    """This rank's checkpoint reads (module docstring) from a checkpoint chunked by `chunking`
    (default: whole layers). Every rank of a DP x CP group holds the same TP x PP slice, so the
    group's shards are this rank's, each held by all of the group."""
    from megatron.core.dist_checkpointing.exchange_utils import (_shard_size,
                                                                 distribute_shards_to_ranks)
    from megatron.core.dist_checkpointing.utils import _sharded_tensor_shard_id
    tp, vocab = cfg.parallel.tp, cfg.model.vocab_size
    chunking = chunking or Chunking.for_model(cfg.model, 1)
    whole = Chunking.for_model(cfg.model, 1)
    shards = {_sharded_tensor_shard_id(s): s for s in _shard_tensors(chunks)}
    stored = {k: stored_bytes(s, chunking, vocab_size=vocab, tp=tp) for k, s in shards.items()}
    everyone = list(range(group_size))
    owner = distribute_shards_to_ranks({k: everyone for k in shards},
                                       {k: int(_shard_size(s)) for k, s in shards.items()},
                                       group_size, set())
    slice_bytes = sum(stored.values())
    stage = sum(stored_bytes(s, chunking, vocab_size=vocab, tp=tp, tp_rank=r)
                for s in shards.values() for r in range(tp))
    # every TP rank requests the replicated tensors: count the stage's checkpoint share once
    share = sum(stored_bytes(s, whole, vocab_size=vocab, tp=tp) for s in shards.values())
    return RankRead(chunk_tp=chunking.tp, slice_bytes=slice_bytes, before_bytes=2 * slice_bytes,
                    after_bytes=sum(b for k, b in stored.items() if owner[k] == group_rank),
                    largest_chunk=max(stored.values(), default=0), shards=len(shards),
                    group_size=group_size, stage_bytes=stage, stage_checkpoint_bytes=share)


def totals(stage_reads: dict[int, dict], *, world: int, tp: int, pp: int) -> dict | None:
    """Bytes the whole job reads, from a `RankRead.as_dict()` of every pipeline stage (any rank
    of it), or None when a stage is missing. Before the parallel load every rank read its slice
    twice; now each DP x CP group reads its slice once: the sum of the stages' `stage_bytes` (TP x
    the checkpoint in whole layers, the checkpoint once, plus the replicated norms TP times, in
    the chunks of the run's TP)."""
    if sorted(stage_reads) != list(range(pp)):
        return None
    checkpoint = sum(r["stage_checkpoint_bytes"] for r in stage_reads.values())
    after = sum(r["stage_bytes"] for r in stage_reads.values())
    chunk_tp = {r["chunk_tp"] for r in stage_reads.values()}
    return {"chunk_tp": chunk_tp.pop() if len(chunk_tp) == 1 else None,
            "checkpoint_bytes": checkpoint, "before_bytes": 2 * (world // (pp * tp)) * after,
            "after_bytes": after}
