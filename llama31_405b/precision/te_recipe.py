"""The GPU precision path: megatron-core's own FP8/FP4 support through Transformer Engine.

No autocast in the training loop: megatron-core 0.19.2 enters TE's quantization context per
transformer layer (fp4_utils.get_fp4_context / fp8_utils.get_fp8_context, keyed by the global
layer number) and skips the BF16 edge layers itself. This module only produces the
TransformerConfig fields and checks the recipe environment:

- `transformer_config_kwargs(cfg)`: fp8/fp8_recipe/fp4/fp4_recipe/fp8_param/fp4_param,
  first_last_layers_bf16 and the edge-layer counts, attention precision, bf16/params_dtype.
- `require_te_env(cfg)`: every environment knob TE 2.20.2 reads for the configured recipe
  (TE_RECIPE_KNOBS: the recipe classes' defaults, read when transformer_engine is imported, and
  TE attention's FP8 recipe knobs) against the config's values; a knob the config does not set
  must be unset. Call it before the first `import megatron.core` / `import transformer_engine`
  of the training process.
  It also checks TE's kernel-choice knobs (TE_KERNEL_KNOBS: attention backend, determinism,
  fused softmax, torch.compile, the cuDNN norm switches, CP's P2P batching) the same way; the
  three attention-backend switches may also carry what megatron-core writes at every model
  build (`attention_env`).
- `verify_te_recipe(cfg)`: after TE is imported, checks the recipe object Megatron will build.
- `te_kernel_record()` / `te_kernel_line`: the attention backend TE selected, the kernel
  knobs in effect and which of them megatron-core set at the model build, for first-contact
  and the start of a training run.
- `ub_quantization_modes(cfg)`: the TE userbuffer modes for TP communication overlap.
- `high_precision_load_targets` / `keep_checkpoint_master_values`: with fp8/fp4 parameters
  (performance.fp8/fp4_param_gather) the initial checkpoint is read in BF16 and its values
  become the FP32 master weights (see their docstrings).

Verified against Transformer Engine 2.20.2 and megatron-core 0.19.2 (docs/nvfp4.md lists the
call sites and evidence).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..config import launch_env
from ..config.schema import Config
from ..config.validate_gpu import precision_rules, userbuffer_rules
from .attention_env import ATTENTION_BACKEND, megatron_attention_env

if TYPE_CHECKING:
    import torch
    from megatron.core.dist_checkpointing.mapping import ShardedStateDict

# Every environment variable Transformer Engine 2.20.2 reads that shapes the numerics of a recipe
# this project configures, with where TE reads it. Read from TE 2.20.2's published Python sources
# (the transformer_engine 2.20.2 wheel); "2.8" says whether the proven GB200 run's TE 2.8 read it
# too (transformer_engine 2.8.0 wheel). Recipe class defaults are evaluated once, when
# transformer_engine.common.recipe is imported (megatron.core imports TE when installed); the
# attention knobs are read by dot_product_attention's module body and when the attention
# backend and its FP8 recipe are chosen.
_RECIPE = "transformer_engine/common/recipe/__init__.py"
_DPA = "transformer_engine/pytorch/attention/dot_product_attention/"
TE_RECIPE_KNOBS: dict[str, tuple[tuple[str, ...], str, bool]] = {
    # name: (recipes that read it, where in TE 2.20.2, read by TE 2.8)
    "NVTE_NVFP4_DISABLE_RHT": (("NVFP4BlockScaling",), f"{_RECIPE} NVFP4BlockScaling.disable_rht", True),
    "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING": (
        ("NVFP4BlockScaling",), f"{_RECIPE} NVFP4BlockScaling.disable_stochastic_rounding", True),
    "NVTE_NVFP4_DISABLE_2D_QUANTIZATION": (
        ("NVFP4BlockScaling",), f"{_RECIPE} NVFP4BlockScaling.disable_2d_quantization", True),
    "NVTE_NVFP4_ROW_SCALED_ACTIVATION": (
        ("NVFP4BlockScaling",), f"{_RECIPE} NVFP4BlockScaling.row_scaled_activation", False),
    "NVTE_NVFP4_4OVER6": (("NVFP4BlockScaling",), f"{_RECIPE} NVFP4BlockScaling.nvfp4_4over6", False),
    "NVTE_NVFP4_4OVER6_E4M3_USE_256": (
        ("NVFP4BlockScaling",), f"{_RECIPE} NVFP4BlockScaling.nvfp4_4over6_e4m3_use_256", False),
    "NVTE_NVFP4_4OVER6_ERR_MODE": (
        ("NVFP4BlockScaling",), f"{_RECIPE} NVFP4BlockScaling.nvfp4_4over6_err_mode", False),
    "NVTE_BACKWARD_OVERRIDE": (
        ("NVFP4BlockScaling", "DelayedScaling", "Float8CurrentScaling"),
        f"{_RECIPE} NVFP4BlockScaling / DelayedScaling / Float8CurrentScaling .backward_override",
        False),
    "NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES": (
        ("Float8CurrentScaling",), f"{_RECIPE} Float8CurrentScaling.use_power_2_scales", True),
    "NVTE_UNFUSED_FP8_UPDATE": (
        ("DelayedScaling",), "transformer_engine/pytorch/quantization.py FP8GlobalStateManager "
        "(amax and scale update of delayed scaling)", True),
    "NVTE_DPA_FP8_RECIPE": (("DotProductAttention",), f"{_DPA}dot_product_attention.py "
                            "(module) and DotProductAttention.init_fp8_metadata", True),
    "NVTE_DPA_FP8_FORMAT": (("DotProductAttention",), f"{_DPA}dot_product_attention.py (module)",
                            True),
    "NVTE_DPA_FP8DS_AMAX_ALGO": (("DotProductAttention",),
                                 f"{_DPA}dot_product_attention.py (module)", True),
    "NVTE_DPA_FP8DS_AMAX_HISTLEN": (("DotProductAttention",),
                                    f"{_DPA}dot_product_attention.py (module)", True),
    "NVTE_DPA_FP8DS_REDUCE_AMAX": (("DotProductAttention",),
                                   f"{_DPA}dot_product_attention.py (module)", True),
    "NVTE_DPA_FP8CS_O_in_F16": (("DotProductAttention",), f"{_DPA}backends.py and "
                                "context_parallel.py (module)", True),
    "NVTE_FP8_DPA_BWD": (("DotProductAttention",), f"{_DPA}backends.py FusedAttnFunc, "
                         "context_parallel.py, utils.py get_attention_backend", True),
    "NVTE_UnfusedDPA_Emulate_FP8": (("DotProductAttention",), f"{_DPA}dot_product_attention.py "
                                    "and utils.py get_attention_backend", True),
}


# Environment variables with which Transformer Engine 2.20.2 chooses kernels for every run that
# uses its layers, whatever the recipe: which attention implementation, its determinism, fused
# softmax, torch.compile of TE's fusions, cuDNN's norm kernels, context parallelism's P2P
# batching. A run must carry the config's value (its [env] table; the GB200 base sets the two
# norm switches as the proven run did) or none: TE's default (NVTE_FLASH_ATTN, NVTE_FUSED_ATTN
# and NVTE_UNFUSED_ATTN may also carry megatron-core's value: attention_env.py). Where TE
# 2.20.2 reads each (its published Python sources and libtransformer_engine.so):
_DPA_UTILS = f"{_DPA}utils.py get_attention_backend"
TE_KERNEL_KNOBS: dict[str, str] = {
    "NVTE_FLASH_ATTN": f"{_DPA_UTILS} (and the module's _NVTE_FLASH_ATTN)",
    "NVTE_FLASH_ATTN_V2": _DPA_UTILS,
    "NVTE_FLASH_ATTN_V3": _DPA_UTILS,
    "NVTE_FLASH_ATTN_V4": _DPA_UTILS,
    "NVTE_FUSED_ATTN": _DPA_UTILS,
    "NVTE_UNFUSED_ATTN": _DPA_UTILS,
    "NVTE_FUSED_ATTN_USE_FAv2_BWD": f"{_DPA}backends.py FusedAttention.__init__",
    "NVTE_APPLY_QK_LAYER_SCALING": f"{_DPA}backends.py UnfusedDotProductAttention.__init__",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": f"{_DPA}dot_product_attention.py "
                                        "DotProductAttention.__init__ (deterministic)",
    "NVTE_MASKED_SOFTMAX_FUSION": f"{_DPA}softmax.py FusedScaleMaskSoftmax.__init__",
    "NVTE_TORCH_COMPILE": "transformer_engine/pytorch/jit.py (module: jit_fuser)",
    "NVTE_NORM_FWD_USE_CUDNN": "libtransformer_engine.so transformer_engine::normalization::"
                               "use_cudnn_norm_fwd (C++, read once per process)",
    "NVTE_NORM_BWD_USE_CUDNN": "libtransformer_engine.so transformer_engine::normalization::"
                               "use_cudnn_norm_bwd (C++, read once per process)",
    # context parallelism's KV ring: batched (one batch_isend_irecv) or separate sends/receives;
    # unset: "0", but batched anyway below compute capability 10.0 with CP 2 (the HGX H200
    # configs). The GB200 configs (compute capability 10.0, CP 2) leave it unset, TE's default:
    # separate sends/receives; it is not among the proven run's recorded settings
    "NVTE_BATCH_MHA_P2P_COMM": f"{_DPA}context_parallel.py AttnFuncWithCPAndKVP2P.forward and "
                               "AttnFuncWithCPAndKVP2P.backward (batch_p2p_comm)",
}
NORM_KNOBS = ("NVTE_NORM_FWD_USE_CUDNN", "NVTE_NORM_BWD_USE_CUDNN")


def _where(name: str) -> str:
    return TE_RECIPE_KNOBS[name][1] if name in TE_RECIPE_KNOBS else TE_KERNEL_KNOBS[name]


def te_recipes(cfg: Config) -> set[str]:
    """The TE recipe classes (and TE's attention) a GPU run of `cfg` builds: Megatron's
    fp4_utils.get_fp4_recipe (NVFP4BlockScaling) or fp8_utils.get_fp8_recipe (DelayedScaling;
    Float8CurrentScaling for "tensorwise", which transformer_config_kwargs picks with BF16 edge
    layers); with FP8 attention, TE's DotProductAttention adds a current-scaling recipe for
    QKV, O, dO, dQKV and a delayed-scaling one for S, dP (its recipe table). Empty without
    quantized compute."""
    pr = cfg.precision
    if pr.compute == "nvfp4":
        out = {"NVFP4BlockScaling"}
    elif pr.compute == "fp8":
        edges = pr.bf16_layers_at_start > 0 or pr.bf16_layers_at_end > 0
        out = {"Float8CurrentScaling" if edges else "DelayedScaling"}
    else:
        return set()
    out.add("DotProductAttention")
    if pr.attention == "fp8":
        out |= {"Float8CurrentScaling", "DelayedScaling"}
    return out


def expected_te_env(cfg: Config) -> dict[str, str | None]:
    """Every knob of TE_RECIPE_KNOBS that `cfg`'s recipes read -> the value the process must
    carry (None: unset, TE 2.20.2's default). The value is launch_env(cfg)'s: the proven run's
    where it set one (the NVFP4 switches and the attention recipe, from precision.*), the
    project's own FP8 recipe (precision.*), or what the config's [env] table sets on purpose;
    every other knob must be unset: TE's default, which is also TE 2.8's for the knobs TE 2.8
    had, and the only value the proven run can vouch for for those it did not."""
    recipes = te_recipes(cfg)
    env = launch_env(cfg)
    return {name: env.get(name) for name, (readers, _, _) in TE_RECIPE_KNOBS.items()
            if recipes & set(readers)}


def expected_kernel_env(cfg: Config) -> dict[str, str | None]:
    """Every knob of TE_KERNEL_KNOBS -> the value the process must carry: launch_env(cfg)'s (the
    config's [env] table), else None (unset, TE 2.20.2's default)."""
    env = launch_env(cfg)
    return {name: env.get(name) for name in TE_KERNEL_KNOBS}


class RecipeEnvError(RuntimeError):
    """The process environment does not carry the precision recipe of the config, or the config
    breaks one of the validator's precision rules (a config built without `load_config`)."""


def _refuse(cfg: Config, found: list[str]) -> None:
    """The validator's own messages (config.validate_gpu states each TE/Megatron constraint
    once), for configs that reach the recipe without having been validated."""
    if found:
        raise RecipeEnvError(f"{cfg.source or '<config>'}: " + "; ".join(found))


# Any: values of several TransformerConfig field types, passed on by keyword (their names are
# checked by tests/test_megatron_keywords.py)
def transformer_config_kwargs(cfg: Config) -> dict[str, Any]:
    """megatron-core 0.19.2 TransformerConfig fields for cfg.precision (and its param gathers):
    bf16/params_dtype/pipeline_dtype from precision.params, the fp8/fp4 switches and recipes, the
    BF16 edge layers, FP8 attention.

    fp8 uses the "hybrid" format (E4M3 forward, E5M2 gradients) with delayed scaling, or
    per-tensor current scaling ("tensorwise") when BF16 edge layers are configured, since Megatron
    rejects delayed scaling with BF16 edge layers. nvfp4 uses fp4 = "e2m1" with the "nvfp4"
    recipe (TE NVFP4BlockScaling; its RHT/SR/2D knobs come from the environment).
    """
    import torch

    _refuse(cfg, precision_rules(cfg, cfg.derived))
    pr, perf = cfg.precision, cfg.performance
    edges = pr.bf16_layers_at_start > 0 or pr.bf16_layers_at_end > 0
    dtype = torch.bfloat16 if pr.params == "bf16" else torch.float32
    kw: dict[str, Any] = {
        "bf16": pr.params == "bf16",
        "params_dtype": dtype,
        "pipeline_dtype": dtype,
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
        kw["fp4"] = "e2m1"
        kw["fp4_recipe"] = "nvfp4"
        kw["fp4_param"] = perf.fp4_param_gather
    return kw


_SETS = "megatron-core 0.19.2 LanguageModule._set_attention_backend"


def require_te_env(cfg: Config, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Check every recipe knob TE 2.20.2 reads for cfg's recipe (`expected_te_env`) and every
    kernel-choice knob (`expected_kernel_env`: attention backend, determinism, fused softmax,
    torch.compile, the cuDNN norm switches, CP's P2P batching) against the environment: a config
    value missing or different, or a knob set that the config leaves unset, stops the run naming
    the variable. Returns the knobs that must be set.

    The attention-backend switches megatron-core writes at every model build
    (`attention_env.megatron_attention_env` for the builder's TransformerConfig.attention_backend:
    all three "1" for `auto`) may carry megatron's value instead of none: a process that built a
    model before (first-contact's phases) or was started by one (its dp2 ranks) has them. Any
    other value, in the environment or in the config's [env] table, is refused by name: megatron
    would assert at the model build.

    Must run before transformer_engine is imported (megatron.core imports it when installed):
    TE turns some of these variables into defaults at import time.
    """
    env = os.environ if environ is None else environ
    want = {**expected_te_env(cfg), **expected_kernel_env(cfg)}
    megatron = megatron_attention_env(ATTENTION_BACKEND)
    bad = []
    for k, v in sorted(want.items()):
        have, mine = env.get(k), megatron.get(k)
        if mine is not None and v is not None and v != mine:
            bad.append(f"{k}={v} in the config's [env] table conflicts with the model build: "
                       f"{_SETS} sets {k}={mine} for attention_backend {ATTENTION_BACKEND} and "
                       "refuses another value; remove it from [env]")
            continue
        if have == v or (v is None and have is not None and have == mine):
            continue
        if v is None and mine is not None:
            bad.append(f"{k} is set to {have!r} but must be unset or {mine!r}: {_SETS} sets "
                       f"{k}={mine} for attention_backend {ATTENTION_BACKEND} at every model "
                       f"build and refuses another value (read by {_where(k)}): unset it")
        elif v is None:
            bad.append(f"{k} is set to {have!r} but must be unset (Transformer Engine 2.20.2's "
                       f"default; read by {_where(k)}): unset it, or set it in the config's "
                       "[env] table if the run is meant to change the recipe or kernels")
        else:
            bad.append(f"{k}={v} (" + ("missing" if have is None else f"found {have!r}") + ")")
    if bad:
        imported = "transformer_engine" in sys.modules
        raise RecipeEnvError(
            f"{cfg.source or '<config>'}: precision.compute = {cfg.precision.compute}: the "
            "Transformer Engine recipe and kernel environment differs from the config: "
            + "; ".join(bad)
            + (" (TE is already imported in this process, so changing them now is too late)"
               if imported else "")
            + ". Launch through the project's launcher (it exports launch_env(cfg)) or export "
            "them in the job script.")
    return {k: v for k, v in want.items() if v is not None}


_DPA_MODULE = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"


def te_attention_backend() -> str | None:
    """The attention backend Transformer Engine selected for this process's last attention
    shape: TE 2.20.2 `DotProductAttention.forward` keeps what `get_attention_backend` returned
    in its module's `_attention_backends` (and logs "Running with ... backend" at INFO). None
    before any TE attention forward (or without TE)."""
    mod = sys.modules.get(_DPA_MODULE)
    chosen: Mapping[str, object] | None = (getattr(mod, "_attention_backends", None)
                                           if mod is not None else None)
    if not chosen or chosen.get("attention_params") is None:
        return None
    if chosen.get("use_flash_attention"):
        return f"FlashAttention (version {chosen.get('flash_attention_backend')})"
    if chosen.get("use_fused_attention"):
        return f"FusedAttention (sub-backend {chosen.get('fused_attention_backend')})"
    if chosen.get("use_unfused_attention"):
        return "UnfusedDotProductAttention"
    return "none available"


def te_kernel_record(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """What chose this process's TE kernels, for the run's record: the attention backend TE
    selected (`te_attention_backend`, None before the first attention forward), every
    kernel-choice knob as the process carries it (None: unset, TE's default), and which of them
    carry what megatron-core writes at the model build ("set_by_megatron", for the builder's
    "megatron_attention_backend"; None before the first model build). TE 2.20.2 picks
    the norm kernels in its C++ library from NVTE_NORM_*_USE_CUDNN and gives Python no record
    of the choice: the settings in effect are what the record can show."""
    env = os.environ if environ is None else environ
    knobs = {k: env.get(k) for k in TE_KERNEL_KNOBS}
    by_megatron = [f"{k}={v}" for k, v in megatron_attention_env(ATTENTION_BACKEND).items()
                   if knobs.get(k) == v]
    return {"attention_backend": te_attention_backend(),
            "megatron_attention_backend": ATTENTION_BACKEND,
            "set_by_megatron": " ".join(by_megatron) or None,
            **knobs}


def te_kernel_line(record: Mapping[str, str | None]) -> str:
    """One line of `te_kernel_record`: the backend, the norm switches, any other knob set, and
    the attention switches carrying the values megatron-core writes at the model build."""
    parts = [f"attention backend {record.get('attention_backend') or 'not selected yet'}"]
    parts += [f"{k}={record.get(k) if record.get(k) is not None else '<unset>'}"
              for k in NORM_KNOBS]
    by_megatron = (record.get("set_by_megatron") or "").split()
    megatron_keys = {kv.split("=")[0] for kv in by_megatron}
    parts += [f"{k}={v}" for k, v in record.items() if k in TE_KERNEL_KNOBS
              and k not in NORM_KNOBS and k not in megatron_keys and v is not None]
    if by_megatron:
        parts.append(", ".join(by_megatron) + " (set by megatron-core for attention_backend "
                     f"{record.get('megatron_attention_backend')})")
    return "Transformer Engine kernels: " + ", ".join(parts)


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


def ub_quantization_modes(cfg: Config) -> list[str]:
    """Names of TE `UserBufferQuantizationMode` members for `initialize_ub` (TP communication
    overlap), as Megatron's own training (megatron-core 0.19.2
    megatron.training.initialize._initialize_tp_communicators): FP8 buffers for fp8 compute, plus high-precision buffers
    when BF16 edge layers run outside the FP8 autocast (TE looks the communicator up by
    (name, fp8 enabled): TE 2.20.2 transformer_engine.pytorch.module.base.get_ub). Only for a
    config with performance.tp_comm_overlap; NVFP4 has no userbuffer path (the validator's
    `userbuffer_rules`).
    """
    pr = cfg.precision
    if not cfg.performance.tp_comm_overlap:
        raise RecipeEnvError(f"{cfg.source or '<config>'}: userbuffers are only set up with "
                             "performance.tp_comm_overlap = true")
    _refuse(cfg, userbuffer_rules(cfg, cfg.derived))
    if pr.compute == "fp8":
        edges = pr.bf16_layers_at_start > 0 or pr.bf16_layers_at_end > 0
        return ["FP8", "NONE"] if edges else ["FP8"]
    return ["NONE"]


def is_te_quantized(t: object) -> bool:
    """A Transformer Engine quantized tensor (Float8Tensor, NVFP4Tensor, MXFP8Tensor, ...):
    what fp8_param/fp4_param parameters are. Checked by module so CPU code needs no TE."""
    return type(t).__module__.startswith("transformer_engine.") and hasattr(t, "dequantize")


def high_precision_load_targets(sharded_state_dict: ShardedStateDict) -> int:
    """Before `dist_checkpointing.load`: give every sharded tensor whose target is a TE
    quantized parameter a plain tensor of the parameter's nominal dtype and shape to load into,
    so the loaded state dict holds the checkpoint's BF16 values. By default megatron-core
    0.19.2 loads straight into the quantized parameter (TorchDistLoadShardedStrategy
    stream_ckpt_dequant=True: strategies/torch.py MCoreLoadPlanner.resolve_tensor/commit_tensor
    quantize a per-tensor scratch back into the parameter, and serialization.py then skips
    force_all_tensors_to_non_fp8), which loses them. Costs one BF16 copy of this rank's
    quantized weights on the device during the load. Returns how many targets were replaced
    (0 on CPU)."""
    import torch
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    n = 0
    for v in nested_values(sharded_state_dict):
        data = getattr(v, "data", None)
        if data is not None and is_te_quantized(data):
            v.data = torch.empty(tuple(data.shape), dtype=data.dtype, device=data.device)
            n += 1
    return n


def keep_checkpoint_master_values(module: torch.nn.Module,
                                  state_dict: Mapping[str, torch.Tensor]) -> int:
    """After `module.load_state_dict(state_dict)`: make the checkpoint's high-precision values
    the FP32 master weights of quantized parameters.

    With fp8_param/fp4_param, Megatron builds the layers under TE `fp8_model_init(...,
    preserve_high_precision_init_val=True)` (megatron-core 0.19.2 fp4_utils.get_fp4_context
    with is_init=True), so each quantized parameter keeps its *random initial* BF16 value on the
    host (TE 2.20.2 `_high_precision_init_val`, set in transformer_engine.pytorch.module.base),
    and megatron-core's DistributedOptimizer builds its FP32 master shards from
    `get_high_precision_init_val()` when it is created. The initial checkpoint is loaded before
    the optimizer exists, so without this the master weights, and after the first update the
    model, would be the random initialisation.

    `state_dict` is what `dist_checkpointing.load` returned for a sharded state dict prepared
    by `high_precision_load_targets`, so its values are the checkpoint's, not quantized.
    Returns the number of parameters updated."""
    n = 0
    for name, p in module.named_parameters():
        if not hasattr(p, "get_high_precision_init_val") or name not in state_dict:
            continue
        value = state_dict[name]
        if is_te_quantized(value):
            raise RecipeEnvError(
                f"parameter {name}: the checkpoint was loaded into the quantized parameter "
                "itself; call high_precision_load_targets() on the sharded state dict first")
        if tuple(value.shape) != tuple(p.shape):
            raise RecipeEnvError(f"parameter {name}: checkpoint shape {tuple(value.shape)} != "
                                 f"parameter shape {tuple(p.shape)}")
        # TE 2.20.2's attribute of a quantized parameter (module.base), unknown to torch's Parameter
        p._high_precision_init_val = value.detach().to("cpu", copy=True)  # type: ignore[attr-defined]
        n += 1
    return n
