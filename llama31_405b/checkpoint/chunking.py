"""How a checkpoint stores each tensor: in whole layers (TP1) or split the way megatron-core splits
it at a tensor-parallel size TP, so that a run at that TP finds each of its requests in exactly
one stored chunk. The converter splits by it (checkpoint.convert), the model record names it
(checkpoint.format), the read plan counts by it (checkpoint.read_plan).

Why it matters: torch.distributed.checkpoint's `FileSystemReader.read_data` reads every stored
chunk a request overlaps whole (`_StorageInfo.length` bytes). With whole-layer chunks each of a
run's TP ranks reads every layer whole, i.e. the job reads the checkpoint TP times; with the
run's own split, once.

The split megatron-core 0.19.2 makes for the Llama layout (every other tensor is replicated over
TP and stored whole per layer: the two layer norms, the final norm):

- `linear_qkv.weight`: axis 0 in TP pieces (`TELayerNormColumnParallelLinear.sharded_state_dict`
  and the local spec's `ColumnParallelLinear.sharded_state_dict`: `{"weight": 0}`);
- `linear_fc1.weight`: axis 0 in 2 x TP pieces: column-parallel, then `MLP.sharded_state_dict`
  wraps it in `apply_swiglu_sharded_factory`, which gives TP rank r the gate piece r and the up
  piece TP + r of 2 x TP (`singleton_local_shards` off: the project's sharded state dict passes
  no metadata);
- `linear_proj.weight`, `linear_fc2.weight`: axis 1 in TP pieces
  (`TERowParallelLinear.sharded_state_dict` / `RowParallelLinear.sharded_state_dict`:
  `{"weight": 1}`);
- `embedding.word_embeddings.weight`, `output_layer.weight`: axis 0 in TP pieces of the vocab
  padded for that TP (`VocabParallelEmbedding.sharded_state_dict` and `ColumnParallelLinear`
  through `make_tp_sharded_tensor_for_checkpoint`, both `allow_shape_mismatch`). A converted
  checkpoint stores the true vocab rows, so its last piece(s) are cut at the true vocab (a piece
  wholly in the padding is not stored).

The stored global shapes do not change with the split, and torch DCP reshards any request over
any chunking, so a checkpoint split for one TP loads at every TP (a run at another TP reads every
chunk its slice overlaps whole).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config.derived import padded_vocab
from . import mapping

SPLIT_AXIS = {mapping.QKV: 0, mapping.FC1: 0, mapping.PROJ: 1, mapping.FC2: 1,
              mapping.EMBED: 0, mapping.OUTPUT: 0}
"""Canonical key -> the axis (of the tensor without its layer axis) megatron-core splits over TP."""
PIECES_PER_RANK = {mapping.FC1: 2}
"""Pieces of the split axis per TP rank: SwiGLU's gate and up halves are split separately."""
VOCAB_KEYS = (mapping.EMBED, mapping.OUTPUT)
RECORD_KEY = "chunking"
"""The field of the model record (checkpoint.format.MODEL_INFO) that holds `Chunking.record()`."""


class ChunkingError(ValueError):
    """A tensor-parallel size that cannot split the model's tensors."""


def problems(model, tp: int) -> list[str]:
    """Why the model's tensors cannot be split for TP `tp` (empty: they can), naming the keys."""
    if tp < 1:
        return [f"TP {tp}: the chunking's tensor-parallel size must be at least 1"]
    out = []
    for field in ("num_attention_heads", "num_query_groups", "ffn_hidden_size"):
        value = getattr(model, field)
        if value % tp:
            out.append(f"model.{field} = {value} is not divisible by TP {tp}")
    return out


@dataclass(frozen=True, slots=True)
class Chunking:
    """The stored chunks of every tensor: split as at TP `tp` (1: whole layers)."""
    tp: int
    vocab_chunk_rows: int
    """Rows per stored piece of the embedding and output layer: the vocab padded for `tp`
    (config.derived.padded_vocab), over `tp`."""

    @classmethod
    def for_model(cls, model, tp: int) -> Chunking:
        bad = problems(model, tp)
        if bad:
            raise ChunkingError("; ".join(bad))
        return cls(tp=tp, vocab_chunk_rows=padded_vocab(model, tp) // tp)

    @classmethod
    def of_record(cls, info: dict, model) -> Chunking:
        """The chunking a model record names; whole layers for a record without one (every
        conversion before the record had the field stored whole layers)."""
        rec = info.get(RECORD_KEY)
        if rec is None:
            return cls.for_model(model, 1)
        if (not isinstance(rec, dict) or not isinstance(rec.get("tp"), int)
                or not isinstance(rec.get("vocab_chunk_rows"), int) or rec["tp"] < 1
                or rec["vocab_chunk_rows"] < 1):
            raise ChunkingError(f"{RECORD_KEY} = {rec!r} is not a chunking record "
                                "({\"tp\": N, \"vocab_chunk_rows\": R})")
        return cls(tp=rec["tp"], vocab_chunk_rows=rec["vocab_chunk_rows"])

    def record(self) -> dict:
        return {"tp": self.tp, "vocab_chunk_rows": self.vocab_chunk_rows}

    def intervals(self, key: str, axis: int, length: int) -> list[tuple[int, int]]:
        """The stored chunks' extents [start, stop) along `axis` of a tensor of `key` that is
        `length` long there (axes counted without the layer axis)."""
        if SPLIT_AXIS.get(key) != axis:
            return [(0, length)]
        if key in VOCAB_KEYS:
            step = self.vocab_chunk_rows
            return [(s, min(s + step, length)) for s in range(0, length, step)]
        n = self.tp * PIECES_PER_RANK.get(key, 1)
        if length % n:
            raise ChunkingError(f"{key}: axis {axis} of length {length} does not split into "
                                f"{n} pieces (TP {self.tp})")
        step = length // n
        return [(i * step, (i + 1) * step) for i in range(n)]

    def owners(self, key: str, shape: tuple[int, ...]) -> list[int]:
        """The TP ranks whose pieces of a tensor of `key` and `shape` (without the layer axis)
        are stored: every rank for a split tensor, rank 0 for a replicated one."""
        axis = SPLIT_AXIS.get(key)
        if axis is None:
            return [0]
        return sorted({i % self.tp for i in range(len(self.intervals(key, axis, shape[axis])))})

    def read_bytes(self, key: str, shape, offset, size, element_size: int) -> int:
        """Bytes of the stored chunks that a request of the box [offset, offset + size) of a
        tensor of `key` and stored `shape` overlaps (all without the layer axis): each is read
        whole. The box may reach past the stored shape (the padded vocab rows)."""
        total = 1
        for axis, (n, o, s) in enumerate(zip(shape, offset, size)):
            stop = min(o + s, n)
            total *= sum(b - a for a, b in self.intervals(key, axis, n) if a < stop and b > o)
        return total * element_size

    def split(self, sh) -> dict[int, list]:
        """A megatron-core ShardedTensor of the whole tensor (of one layer; SwiGLU's halves
        separately) as its stored pieces, by the TP rank that requests each."""
        axis = SPLIT_AXIS.get(sh.key)
        if axis is None:
            return {0: [sh]}
        a = sh.prepend_axis_num + axis
        start, n = sh.global_offset[a], sh.local_shape[axis]
        spans = self.intervals(sh.key, axis, sh.global_shape[a])
        regular = len({b - x for x, b in spans}) == 1
        out: dict[int, list] = {}
        for i, (lo, hi) in enumerate(spans):
            if hi <= start or lo >= start + n:
                continue
            if lo < start or hi > start + n:
                raise ChunkingError(f"{sh.key}: stored piece [{lo}, {hi}) straddles the "
                                    f"tensor's [{start}, {start + n}) on axis {axis}")
            local = list(sh.local_shape)
            local[axis] = hi - lo
            offset = list(sh.global_offset)
            offset[a] = lo
            frags = None
            if regular and sh.axis_fragmentations is not None:
                grid = list(sh.axis_fragmentations)
                grid[a] = len(spans)
                frags = tuple(grid)
            out.setdefault(i % self.tp, []).append(dataclasses.replace(
                sh, data=sh.data.narrow(axis, lo - start, hi - lo), local_shape=tuple(local),
                global_offset=tuple(offset), axis_fragmentations=frags))
        return out
