"""Megatron distributed checkpoints of the model, loadable at any TP/PP/VP layout.

Each chunk's `sharded_state_dict()` names tensors by their global position (layer numbers are
global, TP shards carry their offsets), so a checkpoint written at one layout loads at another.
A small `llama31_405b.json` beside Megatron's metadata records the model shape, so a checkpoint
of another model is refused with a clear message before any tensor is read.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

MODEL_INFO = "llama31_405b.json"
_SHAPE_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
               "num_query_groups", "kv_channels", "vocab_size")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or of another model."""


def _unwrap(chunk):
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def sharded_model_state(chunks) -> dict:
    sd = {}
    for i, chunk in enumerate(chunks):
        key = "model" if len(chunks) == 1 else f"model{i}"
        sd[key] = _unwrap(chunk).sharded_state_dict()
    return sd


def checkpoint_exists(path: str | Path) -> bool:
    p = Path(path)
    return (p / "metadata.json").is_file() and (p / MODEL_INFO).is_file()


def save_model_checkpoint(chunks, path: str | Path, cfg, *, extra: dict | None = None) -> None:
    """Write the model weights of all ranks to `path` (collective: every rank calls it)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    p = Path(path)
    if dist.get_rank() == 0:
        p.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(sharded_model_state(chunks), str(p))
    if dist.get_rank() == 0:
        info = {k: getattr(cfg.model, k) for k in _SHAPE_KEYS}
        info["padded_vocab_size_at_save"] = cfg.derived.padded_vocab_size
        info["model"] = asdict(cfg.model)
        info.update(extra or {})
        tmp = p / (MODEL_INFO + ".tmp")
        tmp.write_text(json.dumps(info, indent=2))
        tmp.replace(p / MODEL_INFO)   # written last: its presence marks a complete checkpoint
    dist.barrier()


def check_compatible(path: str | Path, cfg) -> dict:
    p = Path(path)
    if not checkpoint_exists(p):
        raise CheckpointError(f"{p}: no complete Megatron distributed checkpoint (missing "
                              f"metadata.json or {MODEL_INFO}); set checkpoint.ckpt_dir/init")
    info = json.loads((p / MODEL_INFO).read_text())
    diff = [f"{k}: checkpoint {info.get(k)} vs config {getattr(cfg.model, k)}"
            for k in _SHAPE_KEYS if info.get(k) != getattr(cfg.model, k)]
    if diff:
        raise CheckpointError(f"{p}: checkpoint does not match the model of {cfg.source}: "
                              + "; ".join(diff))
    return info


def load_model_checkpoint(chunks, path: str | Path, cfg) -> dict:
    """Load model weights saved at any layout into this rank's chunks."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    from ..precision.te_recipe import high_precision_load_targets, keep_checkpoint_master_values
    info = check_compatible(path, cfg)
    sharded = sharded_model_state(chunks)
    # GPU fp8/fp4 parameters (TE quantized tensors): read the checkpoint's BF16 values instead
    # of quantizing them straight into the parameters (no-op otherwise)
    high_precision_load_targets(sharded)
    loaded, missing, unexpected = dist_checkpointing.load(
        sharded, str(path), strict=StrictHandling.RETURN_ALL)
    # extra states (quantization metadata) may differ between the CPU and the TE build of the
    # model, in either direction; every weight must match exactly
    absent = sorted(k for k in unexpected if not k.endswith(_EXTRA_STATE))
    extra = sorted(k for k in missing if not k.endswith(_EXTRA_STATE))
    if absent or extra:
        raise CheckpointError(f"{path}: the checkpoint does not match the model of {cfg.source}: "
                              f"absent from the checkpoint {absent}, not in the model {extra}")
    for i, chunk in enumerate(chunks):
        key = "model" if len(chunks) == 1 else f"model{i}"
        module = _unwrap(chunk)
        state = fill_absent_extra_states(module, loaded[key])
        module.load_state_dict(state, strict=True)
        # GPU fp8/fp4 parameters: the checkpoint's BF16 values seed the FP32 master weights
        # (no-op for plain parameters)
        keep_checkpoint_master_values(module, state)
    return info


_EXTRA_STATE = "_extra_state"


def fill_absent_extra_states(module, state: dict) -> dict:
    """`state` plus None for each `*._extra_state` of `module` the checkpoint does not hold.

    Extra states are Transformer Engine's quantization metadata (Megatron's own layers
    keep them empty); None means "no stored state" to both (TE 2.20.2 module/base.py and
    ops/op.py set_extra_state return on None). The GPU model asks for one the CPU-converted
    checkpoint cannot hold: its final norm is TE's RMSNorm (megatron TransformerBlock uses
    TENorm when TE is installed), whose extra state the PyTorch norm of the CPU build has not.
    Every other key must match exactly (load_model_checkpoint raises otherwise)."""
    out = dict(state)
    for name in module.state_dict(keep_vars=True):
        if name.endswith(_EXTRA_STATE) and name not in out:
            out[name] = None
    return out
