"""Run the GEMMs of Megatron's local-spec transformer linears through the NVFP4 emulation.

On a system whose NVFP4 is "emulated" (CPU), `apply_nvfp4_emulation(model_chunks, cfg)` switches
linear_qkv, linear_proj, linear_fc1 and linear_fc2 (megatron.core.tensor_parallel
ColumnParallelLinear / RowParallelLinear) of every TransformerLayer outside the BF16 edge layers
to NVFP4. It replaces only the layer's `_forward_impl` (the GEMM call of megatron-core 0.19.2's
forward), on the instance: parameters, state dict, checkpoints and DDP hooks stay Megatron's,
and so does the layers' own TP communication (the row-parallel all-reduce / reduce-scatter and
column-parallel gather run in Megatron's forward, outside the GEMM). The GEMM-level collectives
that Megatron's linear function would run are reproduced with Megatron's own mappings:
    sequence parallel: all-gather X in forward, reduce-scatter dX in backward;
    allreduce_dgrad (column-parallel TP > 1 without SP): all-reduce dX in backward.
The embedding, the output layer, norms and attention stay in high precision.
"""
from __future__ import annotations

import types
from typing import TYPE_CHECKING, Literal, Sequence

from .linear import AmaxScope, NVFP4Recipe, nvfp4_linear, tp_amax_groups

if TYPE_CHECKING:
    import torch

    from ..config.schema import Config


def is_bf16_edge_layer(layer_number: int, cfg: Config) -> bool:
    """True if the 1-based GLOBAL transformer layer number is one of the configured BF16 edge
    layers (precision.bf16_layers_at_start / _at_end, counted over the whole model)."""
    pr, n = cfg.precision, cfg.model.num_layers
    if not 1 <= layer_number <= n:
        raise ValueError(f"layer_number {layer_number} outside 1..{n} (model.num_layers)")
    return layer_number <= pr.bf16_layers_at_start or layer_number > n - pr.bf16_layers_at_end


def emulate_linear(module: torch.nn.Module, recipe: NVFP4Recipe, *, scope: AmaxScope = "te",
                   generator: torch.Generator | None = None) -> None:
    """Make one megatron ColumnParallelLinear / RowParallelLinear compute its GEMM in NVFP4."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.tensor_parallel.mappings import (copy_to_tensor_model_parallel_region,
                                                        gather_from_sequence_parallel_region)

    mode: Literal["column", "row"]
    if isinstance(module, ColumnParallelLinear):
        mode = "column"
    elif isinstance(module, RowParallelLinear):
        mode = "row"
    else:
        raise TypeError(f"NVFP4 emulation wraps megatron Column/RowParallelLinear, not "
                        f"{type(module).__name__}")
    if not callable(getattr(type(module), "_forward_impl", None)):
        raise RuntimeError(
            f"NVFP4 emulation hooks {type(module).__name__}._forward_impl (megatron-core 0.19.x); "
            "the installed megatron-core has no such method: install the pinned version "
            "(constraints/cpu.txt)")
    if getattr(module, "gtp_remat_size", 1) > 1:
        raise ValueError("NVFP4 emulation does not support gtp_remat_size > 1")
    in_features = module.weight.shape[1] if module.weight is not None else module.input_size
    if in_features % 16:
        raise ValueError(f"NVFP4 needs the GEMM reduction dimension to be a multiple of 16: "
                         f"{type(module).__name__} has {in_features} input features per rank")
    group = module.tp_group
    groups = tp_amax_groups(mode, group, sequence_parallel=module.sequence_parallel,
                            gathered=True, scope=scope)

    # the parameters of megatron-core 0.19.2 tensor_parallel.layers.ColumnParallelLinear
    # ._forward_impl (RowParallelLinear's is the same)
    def _forward_impl(self: torch.nn.Module, input: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None = None, gradient_accumulation_fusion: bool = False,
                      allreduce_dgrad: bool = False, sequence_parallel: bool = False,
                      grad_output_buffer: list[torch.Tensor] | None = None,
                      wgrad_deferral_limit: int | None = None,
                      tp_group: torch.distributed.ProcessGroup | None = None,
                      gtp_remat_size: int = 1) -> torch.Tensor:
        if grad_output_buffer is not None:
            raise ValueError("NVFP4 emulation: deferred embedding wgrad is not supported")
        if sequence_parallel:      # AG forward / RS backward, as Megatron's linear function does
            total = gather_from_sequence_parallel_region(input, True, group=group)
        elif allreduce_dgrad:      # identity forward / all-reduce of dX backward
            total = copy_to_tensor_model_parallel_region(input, group=group)
        else:
            total = input
        return nvfp4_linear(total, weight, bias, recipe=recipe, amax_groups=groups,
                            generator=generator, accumulate_main_grad=gradient_accumulation_fusion)

    # an instance attribute: not a parameter or buffer, so state_dict/checkpoints are unchanged
    # (replacing the method on the instance is the point; torch types Module.__setattr__'s
    # value Tensor | Module, where any attribute that is neither is set as a plain one)
    module._forward_impl = types.MethodType(_forward_impl, module)  # type: ignore[method-assign]
    module.nvfp4_recipe = recipe  # type: ignore[assignment]


def apply_nvfp4_emulation(model_chunks: torch.nn.Module | Sequence[torch.nn.Module], cfg: Config,
                          *, generator: torch.Generator | None = None) -> int:
    """Switch the transformer-layer linears of a Megatron GPTModel (local spec) to NVFP4.

    model_chunks: a module or a list of modules (virtual-pipeline chunks, possibly DDP-wrapped).
    cfg: the run Config. Nothing happens (returns 0) unless precision.compute == "nvfp4" on a
    system whose NVFP4 is emulated; on native systems Transformer Engine quantizes (te_recipe).
    generator: torch.Generator for the stochastic-rounding bits (default: torch's global RNG).
    Returns the number of linear layers switched to NVFP4 (4 per quantized transformer layer).
    Calling it again on the same model is a no-op for the layers already switched.
    """
    import torch
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from ..systems import load_system

    if cfg.precision.compute != "nvfp4" or load_system(cfg.system.id).nvfp4 != "emulated":
        return 0
    recipe = NVFP4Recipe.from_config(cfg)
    scope = cfg.precision.nvfp4_tp_amax
    chunks = model_chunks if isinstance(model_chunks, (list, tuple)) else [model_chunks]
    count = 0
    for chunk in chunks:
        if not isinstance(chunk, torch.nn.Module):
            raise TypeError(f"apply_nvfp4_emulation: expected torch modules, got {type(chunk)}")
        for layer in chunk.modules():
            if not isinstance(layer, TransformerLayer) or is_bf16_edge_layer(layer.layer_number, cfg):
                continue
            linears = [(name, m) for name, m in layer.named_modules()
                       if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
            if not linears:
                raise RuntimeError(
                    f"apply_nvfp4_emulation: transformer layer {layer.layer_number} has no megatron "
                    "Column/RowParallelLinear (built with the Transformer Engine spec?); the "
                    "emulation needs the local layer spec")
            for _, m in linears:
                if getattr(m, "nvfp4_recipe", None) is None:
                    emulate_linear(m, recipe, scope=scope, generator=generator)
                count += 1
    return count
