"""The Megatron distributed checkpoint of the model: the one module that writes, reads and
checks it. Training (initial checkpoint, read once per run; tiny pre-training), conversion and
verification all go through here.

A checkpoint directory holds

- Megatron's torch_dist files: `metadata.json` (Megatron's backend record), `.metadata` (torch
  DCP's index of every tensor chunk) and the data files. Each chunk's `sharded_state_dict()`
  names tensors by their global position (global layer numbers, TP offsets), so a checkpoint
  written at one TP/PP/VP layout loads at any other;
- `llama31_405b.json` (MODEL_INFO): the model section it was written for, the shape fields at
  top level, the number of vocab rows stored, how the tensors are chunked (`chunking`:
  checkpoint.chunking; absent in conversions from before it, which stored whole layers), and
  where the weights came from. Written last and
  atomically by every writer: its presence marks a complete checkpoint, and its shape fields let
  a checkpoint of another model be refused by name before any tensor is read.

Extra-state policy (the one rule for `*._extra_state`): **written, never read.** Megatron's
sharded state dict carries each module's `_extra_state` (Transformer Engine's quantization
metadata; Megatron's own layers return None), and saves keep it, so the files are what
megatron-core writes. Loading reads weights only: every `_extra_state` request is taken out of
the sharded state dict before the load, and each module keeps the state it was built with.
Why, case by case (megatron-core 0.19.2, Transformer Engine 2.20.2):

- a CPU-converted checkpoint loaded by the TE model on GPU: the layer specs differ in which
  modules have extra state (TE's RMSNorm final norm and attention core have one, the PyTorch
  ones of the CPU build do not), and what the CPU build stores is None, which TE's
  `TransformerEngineBaseModule.set_extra_state` and `BasicOperation.set_extra_state` ignore;
  reading it would only add a key mismatch to explain away;
- a TE-saved checkpoint read on CPU: Megatron's `ColumnParallelLinear.set_extra_state` and
  `RowParallelLinear.set_extra_state` ignore whatever they are given;
- a load into a model whose TE modules already ran (a reload after a warm-up; the warm-up itself
  no longer reads the checkpoint again, train.warmup): the NVFP4 and current-scaling
  recipes are stateless (TE's `get_extra_state` saves an empty tensor, `set_extra_state` skips
  it), while a delayed-scaling FP8 state is a pickle that TE refuses to load unless
  NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1, and that `TransformerEngineBaseModule.set_extra_state`
  loads by re-creating the recipe's tensors (`init_fp8_meta_tensors`), which would move
  buffers that CUDA graphs captured during the warm-up point to. train.warmup puts the recipe
  statistics back itself.

So a run starts with fresh quantization statistics whatever checkpoint it starts from, as the
benchmark's timed run does from the BF16 initial checkpoint. Every weight must match exactly in
both directions: a weight the model asks for and the checkpoint lacks, or one the checkpoint
holds and no rank asks for, is an error naming the key.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

MODEL_INFO = "llama31_405b.json"
MEGATRON_CONFIG = "metadata.json"     # megatron-core dist_checkpointing.core.CONFIG_FNAME
DCP_METADATA = ".metadata"            # torch.distributed.checkpoint's index
EXTRA_STATE = "_extra_state"
SHAPE_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
              "num_query_groups", "kv_channels", "vocab_size")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, of another model or does not fit the model."""


def is_extra_state(key: str) -> bool:
    return key.rsplit(".", 1)[-1] == EXTRA_STATE


def chunk_keys(n: int) -> list[str]:
    """The top-level keys of n model chunks, as Megatron-LM names them: `model`, or `model0`,
    `model1`, ... with virtual pipeline stages."""
    return ["model"] if n == 1 else [f"model{i}" for i in range(n)]


def sharded_state(chunks) -> dict:
    """The sharded state dict of this rank's model chunks (DDP wrappers removed)."""
    from ..model.builder import unwrap
    return {k: unwrap(c).sharded_state_dict() for k, c in zip(chunk_keys(len(chunks)), chunks)}


# -- completeness and the model-info file --------------------------------------------------------
def missing_files(path: str | Path) -> list[str]:
    """The files of a complete checkpoint that `path` lacks (empty: complete)."""
    p = Path(path)
    return [n for n in (MEGATRON_CONFIG, DCP_METADATA, MODEL_INFO) if not (p / n).is_file()]


def is_complete(path: str | Path) -> bool:
    return not missing_files(path)


def write_model_info(path: str | Path, cfg, *, stored_vocab_rows: int,
                     extra: dict[str, Any] | None = None) -> None:
    """Write MODEL_INFO into `path` (rank 0, after every tensor is on disk): the shape fields,
    the whole model section, the vocab rows the embedding and output layer hold on disk, and
    `extra` (provenance). Atomic: its presence marks a complete checkpoint."""
    p = Path(path)
    info = {k: getattr(cfg.model, k) for k in SHAPE_KEYS}
    info["model"] = asdict(cfg.model)
    info["padded_vocab_size_at_save"] = stored_vocab_rows
    info.update(extra or {})
    tmp = p / (MODEL_INFO + ".tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    tmp.replace(p / MODEL_INFO)


def check_compatible(path: str | Path, cfg, *, key: str = "") -> dict:
    """The checkpoint's model info, after checking that it is complete and of cfg's model (its
    files' presence and MODEL_INFO, then every data file its index names; no tensor read).
    `key`: what named the path (a config key or an option), put in front of it in messages."""
    p = Path(path)
    where = f"{key} = {p}" if key else str(p)
    lacking = missing_files(p)
    if lacking:
        raise CheckpointError(f"{where}: no complete Megatron distributed checkpoint (missing "
                              f"{', '.join(lacking)}); set checkpoint.ckpt_dir/init, or convert "
                              "or pre-train it first (docs/checkpoint.md)")
    try:
        info = json.loads((p / MODEL_INFO).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{where}: {MODEL_INFO} cannot be read ({e}); the checkpoint is "
                              "damaged: convert or pre-train it again (docs/checkpoint.md)") from None
    if not isinstance(info, dict):
        raise CheckpointError(f"{where}: {MODEL_INFO} is not a JSON object; the checkpoint is "
                              "damaged: convert or pre-train it again (docs/checkpoint.md)")
    diff = [f"{k}: checkpoint {info.get(k)} vs config {getattr(cfg.model, k)}"
            for k in SHAPE_KEYS if info.get(k) != getattr(cfg.model, k)]
    if diff:
        raise CheckpointError(f"{where}: checkpoint does not match the model of {cfg.source}: "
                              + "; ".join(diff))
    stored_chunking(info, cfg, where)
    check_data_files(p, where)
    return info


def check_data_files(path: Path, where: str) -> None:
    """Every data file the checkpoint's torch DCP index names is there and as long as the index
    records (checkpoint.data_files: the index and stat, no tensor read)."""
    from .data_files import file_problems
    try:
        bad = file_problems(path)
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}; the checkpoint is damaged: copy it again, or "
                              "convert or pre-train it again (docs/checkpoint.md)") from None
    if bad:
        more = f" (and {len(bad) - 1} more file(s))" if len(bad) > 1 else ""
        raise CheckpointError(
            f"{where}: {bad[0]}{more}: the checkpoint's {DCP_METADATA} names data files that "
            "are not all there (an interrupted copy, a deleted file); copy the whole checkpoint "
            "folder again, or convert or pre-train it again (docs/checkpoint.md)")


def stored_chunking(info: dict, cfg, where: str = ""):
    """How the checkpoint of model record `info` stores its tensors (checkpoint.chunking.Chunking;
    any chunking loads at any TP, the record only says what a load reads)."""
    from .chunking import Chunking, ChunkingError
    try:
        return Chunking.of_record(info, cfg.model)
    except ChunkingError as e:
        raise CheckpointError(f"{where or 'checkpoint'}: {MODEL_INFO}: {e}; the record is "
                              "damaged: convert or pre-train it again (docs/checkpoint.md)") from None


# -- save and load -------------------------------------------------------------------------------
def save(chunks, path: str | Path, cfg, *, extra: dict | None = None) -> None:
    """Write the model weights of all ranks to `path` (collective: every rank calls it)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from ..outputs import mkdir_exclusive, publish, temp_sibling
    p = Path(path)
    # written whole under a temporary name, then moved into place by an operation that cannot
    # replace (outputs.publish): `path` is complete or absent, never a mix of two saves
    name = [str(mkdir_exclusive(temp_sibling(p))) if dist.get_rank() == 0 else ""]
    dist.broadcast_object_list(name, src=0)
    tmp = Path(name[0])
    dist_checkpointing.save(sharded_state(chunks), str(tmp))
    dist.barrier()
    if dist.get_rank() == 0:
        # stored as the run holds it: in the chunks of its TP, at its padded vocab
        from .chunking import RECORD_KEY, Chunking
        chunks_record = {RECORD_KEY: Chunking.for_model(cfg.model, cfg.parallel.tp).record()}
        write_model_info(tmp, cfg, stored_vocab_rows=cfg.derived.padded_vocab_size,
                         extra={**chunks_record, **(extra or {})})
        if p.exists():      # train-init --force: the earlier checkpoint is kept, renamed
            kept = publish(p, p.with_name(p.name + ".earlier"), unique=True)
            print(f"[checkpoint] the earlier checkpoint {p} is kept as {kept}", file=sys.stderr)
        publish(tmp, p, advice="another save put a checkpoint there meanwhile; this one is "
                f"left in {tmp}")
    dist.barrier()


def drop_extra_states(sharded: dict) -> list[str]:
    """Take every `_extra_state` request out of a sharded state dict (the extra-state policy in
    the module docstring); return their keys."""
    dropped: list[str] = []

    def walk(d: dict) -> None:
        for k in list(d):
            if isinstance(d[k], dict):
                walk(d[k])
            elif is_extra_state(str(k)):
                dropped.append(getattr(d.pop(k), "key", str(k)))
    walk(sharded)
    return dropped


def load_into(module, state: dict, where: str) -> None:
    """Copy a loaded state dict into `module` in place: every entry of the module must be in
    `state` except its extra states, and nothing else may be."""
    own = module.state_dict(keep_vars=True)
    lacking = sorted(k for k in own.keys() - state.keys() if not is_extra_state(k))
    unknown = sorted(state.keys() - own.keys())
    if lacking or unknown:
        raise CheckpointError(f"{where}: the loaded state does not fit the model: lacking "
                              f"{lacking[:6]}, not in the model {unknown[:6]}")
    module.load_state_dict(state, strict=False)


def load_group():
    """The ranks that hold the same weights as this one and share the reading of them: the data-
    and context-parallel group (every rank of it has this rank's TP x PP slice; context
    parallelism splits sequences, not parameters). None when it is this rank alone or Megatron's
    groups do not exist (a single process)."""
    from megatron.core import parallel_state as ps
    if not ps.model_parallel_is_initialized():
        return None
    group = ps.get_data_parallel_group(with_context_parallel=True)
    return group if group is not None and group.size() > 1 else None


def load_strategy():
    """megatron-core 0.19.2's torch_dist load strategy, fully parallel over `load_group()`.

    `FullyParallelLoadStrategyWrapper` (dist_checkpointing/strategies/fully_parallel.py)
    exchanges the shard metadata of the group, assigns every shard to one rank of it (greedy by
    size, `exchange_utils.distribute_shards_to_ranks`), lets each rank read only its shards
    (replica_id 0; the others are deferred) and broadcasts them to the rest of the group. So a
    slice is read once per group instead of once per rank. Megatron-LM's own loader does the
    same with `--ckpt-fully-parallel-load` (megatron/training/checkpointing.py
    `_load_global_dist_base_checkpoint`: the data-parallel group with context parallelism,
    exchange algorithm "broadcast", the only one it calls numerically safe). The wrapper falls
    back to the plain strategy for a group of one."""
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelLoadStrategyWrapper)
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistLoadShardedStrategy
    base = TorchDistLoadShardedStrategy()
    group = load_group()
    if group is None:
        return base
    return FullyParallelLoadStrategyWrapper(base, group, exchange_algo="broadcast")


def load(chunks, path: str | Path, cfg) -> dict:
    """Load model weights saved at any layout into this rank's chunks, in place (the parameter
    tensors stay the same objects). Collective; each rank reads only its share of the slice that
    its data- and context-parallel group holds (`load_strategy`). Returns the checkpoint's model
    info."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    from ..model.builder import unwrap
    from ..precision.te_recipe import high_precision_load_targets, keep_checkpoint_master_values
    info = check_compatible(path, cfg)
    sharded = sharded_state(chunks)
    drop_extra_states(sharded)
    # the record matched; do the tensors? (checkpoint.shapes: tensor and both shapes named)
    from .shapes import contradiction
    refused = contradiction(sharded, path, cfg.source, MODEL_INFO)
    if refused:
        raise CheckpointError(refused)
    # GPU fp8/fp4 parameters (TE quantized tensors): read the checkpoint's BF16 values instead
    # of quantizing them straight into the parameters (no-op otherwise)
    high_precision_load_targets(sharded)
    # RETURN_ALL: megatron-core compares the keys of every rank's request with the checkpoint's
    # (the metadata exchange its access-integrity check does anyway)
    # with RETURN_ALL, megatron-core 0.19.2 dist_checkpointing.load returns (state dict,
    # unexpected keys, missing keys); its annotation is the union of that and a state dict
    loaded, in_ckpt_only, requested_only = cast(tuple[dict, set, set], dist_checkpointing.load(
        sharded, str(path), sharded_strategy=load_strategy(),
        strict=StrictHandling.RETURN_ALL))
    absent = sorted(requested_only)
    unread = sorted(k for k in in_ckpt_only if not is_extra_state(k))
    if absent or unread:
        raise CheckpointError(f"{path}: the checkpoint does not match the model of {cfg.source}: "
                              f"absent from the checkpoint {absent[:6]}, not in the model "
                              f"{unread[:6]}")
    for key, chunk in zip(chunk_keys(len(chunks)), chunks):
        module = unwrap(chunk)
        load_into(module, loaded[key], f"{path} [{key}]")
        # GPU fp8/fp4 parameters: the checkpoint's BF16 values seed the FP32 master weights
        # (no-op for plain parameters)
        keep_checkpoint_master_values(module, loaded[key])
    return info
