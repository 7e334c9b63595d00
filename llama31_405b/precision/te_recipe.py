"""The GPU precision path: megatron-core's own FP8/FP4 support through Transformer Engine.

No autocast in the training loop: megatron-core 0.19.2 enters TE's quantization context per
transformer layer (fp4_utils.get_fp4_context / fp8_utils.get_fp8_context, keyed by the global
layer number) and skips the BF16 edge layers itself. This module only produces the
TransformerConfig fields and checks the recipe environment:

- `transformer_config_kwargs(cfg)`: fp8/fp8_recipe/fp4/fp4_recipe/fp8_param/fp4_param,
  first_last_layers_bf16 and the edge-layer counts, attention precision, bf16/params_dtype.
- `require_te_env(cfg)`: TE's NVFP4BlockScaling reads NVTE_NVFP4_DISABLE_{RHT,
  STOCHASTIC_ROUNDING,2D_QUANTIZATION} as class defaults when transformer_engine is imported
  (and megatron.core imports TE at import time when it is installed). Call it before the first
  `import megatron.core` / `import transformer_engine` of the training process.
- `verify_te_recipe(cfg)`: after TE is imported, checks the recipe object Megatron will build.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from ..config import launch_env
from ..config.schema import Config

# the recipe variables TE reads at import time; the launcher exports them (config/env.py)
TE_IMPORT_TIME_VARS = ("NVTE_NVFP4_DISABLE_RHT", "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING",
                       "NVTE_NVFP4_DISABLE_2D_QUANTIZATION", "NVTE_DPA_FP8_RECIPE")


class RecipeEnvError(RuntimeError):
    """The process environment does not carry the precision recipe of the config."""


def transformer_config_kwargs(cfg: Config) -> dict:
    """megatron-core 0.19.2 TransformerConfig fields for cfg.precision (and its param gathers).

    fp8 uses the "hybrid" format (E4M3 forward, E5M2 gradients) with delayed scaling, or
    per-tensor current scaling ("tensorwise") when BF16 edge layers are configured, since Megatron
    rejects delayed scaling with BF16 edge layers. nvfp4 uses fp4 = "e2m1" with the "nvfp4"
    recipe (TE NVFP4BlockScaling; its RHT/SR/2D knobs come from the environment).
    """
    import torch

    pr, perf = cfg.precision, cfg.performance
    edges = pr.bf16_layers_at_start > 0 or pr.bf16_layers_at_end > 0
    kw: dict = {
        "bf16": pr.params == "bf16",
        "params_dtype": torch.bfloat16 if pr.params == "bf16" else torch.float32,
        "fp8": None,
        "fp4": None,
        "fp8_param": False,
        "fp4_param": False,
        "first_last_layers_bf16": False,
        "fp8_dot_product_attention": pr.attention == "fp8",
        "fp8_multi_head_attention": False,
    }
    if pr.compute in ("fp8", "nvfp4"):
        kw["first_last_layers_bf16"] = edges
        kw["num_layers_at_start_in_bf16"] = pr.bf16_layers_at_start
        kw["num_layers_at_end_in_bf16"] = pr.bf16_layers_at_end
    if pr.compute == "fp8":
        kw["fp8"] = "hybrid"
        kw["fp8_recipe"] = "tensorwise" if edges else "delayed"
        kw["fp8_param"] = perf.fp8_param_gather
    elif pr.compute == "nvfp4":
        if perf.fp8_param_gather:
            raise RecipeEnvError(
                f"{cfg.source or '<config>'}: performance.fp8_param_gather with precision.compute "
                "= nvfp4: megatron-core requires fp8_param together with fp8 compute; use "
                "performance.fp4_param_gather for NVFP4 parameters")
        kw["fp4"] = "e2m1"
        kw["fp4_recipe"] = "nvfp4"
        kw["fp4_param"] = perf.fp4_param_gather
    elif pr.attention == "fp8":
        raise RecipeEnvError(f"{cfg.source or '<config>'}: precision.attention = fp8 needs "
                             "precision.compute = fp8 or nvfp4")
    return kw


def require_te_env(cfg: Config, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Check that the recipe variables of launch_env(cfg) are in the environment with the
    config's values; returns them. Raises RecipeEnvError naming every missing/mismatched one.

    Must run before transformer_engine is imported (megatron.core imports it when installed):
    TE turns these variables into the recipe's defaults at import time.
    """
    env = os.environ if environ is None else environ
    want = {k: v for k, v in launch_env(cfg).items() if k in TE_IMPORT_TIME_VARS}
    bad = [f"{k}={v} (found {env[k]!r})" if k in env else f"{k}={v} (missing)"
           for k, v in sorted(want.items()) if env.get(k) != v]
    if bad:
        imported = "transformer_engine" in sys.modules
        raise RecipeEnvError(
            f"{cfg.source or '<config>'}: precision.compute = {cfg.precision.compute} needs "
            f"{', '.join(bad)} in the environment before Transformer Engine is imported"
            + (" (it is already imported in this process, so setting them now is too late)"
               if imported else "")
            + ". Launch through the project's launcher (it exports launch_env(cfg)) or export "
            "them in the job script.")
    return want


def verify_te_recipe(cfg: Config) -> None:
    """After import: the NVFP4BlockScaling recipe Megatron builds matches cfg.precision."""
    if cfg.precision.compute != "nvfp4":
        return
    from transformer_engine.common.recipe import NVFP4BlockScaling  # GPU environments only

    recipe = NVFP4BlockScaling()
    pr = cfg.precision
    got = {"disable_rht": recipe.disable_rht,
           "disable_stochastic_rounding": recipe.disable_stochastic_rounding,
           "disable_2d_quantization": recipe.disable_2d_quantization}
    want = {"disable_rht": not pr.nvfp4_rht,
            "disable_stochastic_rounding": not pr.nvfp4_stochastic_rounding,
            "disable_2d_quantization": not pr.nvfp4_2d_weights}
    diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    if diff:
        raise RecipeEnvError(
            f"{cfg.source or '<config>'}: Transformer Engine's NVFP4BlockScaling defaults "
            f"{ {k: g for k, (g, _) in diff.items()} } differ from the config "
            f"{ {k: w for k, (_, w) in diff.items()} }: TE was imported before the recipe "
            "environment (launch_env) was set")
