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
)


def quiet_known_warnings() -> None:
    for prefix in _IGNORED:
        warnings.filterwarnings("ignore", message=re.escape(prefix))
