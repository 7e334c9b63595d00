"""How many bytes each rank reads from the initial checkpoint, computed from the model's sharded
state dict without reading any (the rehearsal's figure; docs/checkpoint.md, docs/rehearsal.md).

Two facts decide it:

- what torch.distributed.checkpoint reads: `FileSystemReader.read_data` reads every stored chunk
  a request overlaps whole (`_StorageInfo.length` bytes, then `torch.load` and a narrow), so a
  rank pays for the stored chunk, not for its slice of it. `checkpoint convert` writes the model
  at TP1/PP1, one chunk per layer of each decoder tensor (SwiGLU's gate and up halves apart) and
  one per other tensor (embedding and output layer at the true vocab rows): a request of any
  TP shard of a tensor costs the whole layer of that tensor (of that SwiGLU half);
- who reads: `checkpoint.format.load_strategy` (megatron-core 0.19.2 FullyParallelLoadStrategyWrapper
  over the DP x CP group) gives each shard of the group's slice to one rank, by megatron-core's
  own greedy assignment (`exchange_utils.distribute_shards_to_ranks`, by shard size); before it,
  every rank read its whole slice, and the warm-up restore read it again.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from math import prod


@dataclass
class RankRead:
    slice_bytes: int
    """Stored bytes behind this rank's TP x PP slice: what one plain load reads on this rank."""
    before_bytes: int
    """Before the parallel load: the slice at init and again at the warm-up restore."""
    after_bytes: int
    """Now: the stored chunks megatron-core assigns to this rank of its DP x CP group."""
    largest_chunk: int
    shards: int
    group_size: int

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


def stored_chunk_bytes(sh, *, vocab_size: int, tp: int) -> int:
    """Bytes of the converted checkpoint's chunk behind shard `sh`. The converter saves the
    TP1/PP1 model, whose shards are this one's with every TP-sharded axis whole: an axis split
    into f pieces here (a multiple of TP: TP for a TP-sharded axis, 2 x TP for SwiGLU's fc1,
    whose gate and up halves are separate shards) is split into f / TP there; the prepended
    layer axis keeps one layer per chunk. The vocab axis of the tensors Megatron marks
    `allow_shape_mismatch` (embedding, output layer) is stored at the true vocab rows."""
    import torch
    shape = list(sh.global_shape[sh.prepend_axis_num:])
    frags = list(sh.axis_fragmentations or [1] * len(sh.global_shape))[sh.prepend_axis_num:]
    if sh.allow_shape_mismatch and shape:
        shape[0] = min(shape[0], vocab_size)
    pieces = [f // tp if f > 1 and f % tp == 0 else f for f in frags]
    elements = prod(-(-n // k) for n, k in zip(shape, pieces))
    return elements * torch.tensor([], dtype=sh.dtype).element_size()


def rank_read(chunks, cfg, *, group_size: int, group_rank: int) -> RankRead:
    """This rank's checkpoint reads (module docstring). Every rank of a DP x CP group holds the
    same TP x PP slice, so the group's shards are this rank's, each held by all of the group."""
    from megatron.core.dist_checkpointing.exchange_utils import (_shard_size,
                                                                 distribute_shards_to_ranks)
    from megatron.core.dist_checkpointing.utils import _sharded_tensor_shard_id
    shards = {_sharded_tensor_shard_id(s): s for s in _shard_tensors(chunks)}
    stored = {k: stored_chunk_bytes(s, vocab_size=cfg.model.vocab_size, tp=cfg.parallel.tp)
              for k, s in shards.items()}
    everyone = list(range(group_size))
    owner = distribute_shards_to_ranks({k: everyone for k in shards},
                                       {k: int(_shard_size(s)) for k, s in shards.items()},
                                       group_size, set())
    slice_bytes = sum(stored.values())
    return RankRead(slice_bytes=slice_bytes, before_bytes=2 * slice_bytes,
                    after_bytes=sum(b for k, b in stored.items() if owner[k] == group_rank),
                    largest_chunk=max(stored.values(), default=0), shards=len(shards),
                    group_size=group_size)


def totals(stage_slice_bytes: dict[int, int], *, world: int, tp: int, pp: int) -> dict | None:
    """Bytes the whole job reads, from the slice bytes of every pipeline stage (any TP rank of
    it: the converted chunks hold every TP slice), or None when a stage is missing. Before:
    every rank read its stage's slice twice; now each DP x CP group reads its slice once, so the
    checkpoint is read once per TP rank (TP x its size: the TP1 chunks are read whole)."""
    if sorted(stage_slice_bytes) != list(range(pp)):
        return None
    checkpoint = sum(stage_slice_bytes.values())
    return {"checkpoint_bytes": checkpoint, "before_bytes": 2 * (world // pp) * checkpoint,
            "after_bytes": tp * checkpoint}
