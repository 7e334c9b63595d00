"""Warnings the dependencies emit on every run that say nothing actionable to our users.

Each entry is a message prefix, filtered exactly (not by category), so that new or unexpected
warnings still reach the user. Applied once by the CLI entry point in every process.
"""
from __future__ import annotations

import re
import warnings

_IGNORED = (
    # megatron-core without Transformer Engine / Apex: expected on CPU (TE is the gpu extra)
    "Transformer Engine and Apex are not installed",
    "Apex is not installed. Falling back to Torch Norm",
    "absl.logging is not installed",
    "MimoModelConfig is experimental",
    "Could not determine rank from torch.distributed",
    # megatron-core 0.19's own TransformerConfig default for cuda_graph_modules
    "full scope is deprecated. Use empty cuda_graph_modules",
    # torch 2.13 deprecations inside megatron-core's own calls
    "`torch.distributed.reduce_scatter_tensor` is deprecated",
    "`torch.distributed.all_gather_into_tensor` is deprecated",
    "`torch.jit.script_method` is deprecated",
    # megatron-core reads .grad of non-leaf tensors while building its grad buffers
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed",
    # megatron-core 0.19.2 `TorchDistLoadShardedStrategy.load` (dist_checkpointing/strategies/
    # torch.py) calls torch.distributed.checkpoint `load(..., no_dist=True)` on purpose, in every
    # process group: each rank reads its own shards (the fully parallel wrapper exchanges them
    # over the load group), so torch's "assuming ... a single process" is true and says nothing
    # about our process groups, which are up (seen on every run, also at 4 ranks)
    "torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to load "
    "in a single process",
    # the same call passes the state dict and the reader positionally, which torch's
    # `_api_bc_check` (torch.distributed.checkpoint.utils) flags on every load
    "The argument order of load has been changed",
    # and hands torch the shards as torch ShardedTensors (`mcore_to_pyt_state_dict`), which torch
    # 2.13 deprecates in favour of DTensor (torch.distributed._shard DEPRECATE_MSG)
    "Please use DTensor instead and we are deprecating ShardedTensor",
)


def quiet_known_warnings() -> None:
    for prefix in _IGNORED:
        warnings.filterwarnings("ignore", message=re.escape(prefix))
