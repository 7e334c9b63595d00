"""NVFP4 in the model: the emulation hook on a megatron GPTModel, the GPU recipe settings, and the
config check that refuses NVFP4 where it cannot run."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llama31_405b.config import ConfigError, launch_env, load_config, problems, validate
from llama31_405b.precision.emulation import is_bf16_edge_layer
from llama31_405b.precision.te_recipe import (RecipeEnvError, require_te_env,
                                              transformer_config_kwargs)

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny_cpu.toml"
GB200 = ROOT / "configs" / "config_GB200_512x4x32xtp4pp8cp2.toml"


def _tiny(**precision):
    return load_config(TINY, overrides={"precision": precision})


def test_bf16_edge_layers_use_global_numbers():
    cfg = _tiny(compute="nvfp4", bf16_layers_at_start=1, bf16_layers_at_end=2)
    assert [is_bf16_edge_layer(i, cfg) for i in range(1, 5)] == [True, False, True, True]
    with pytest.raises(ValueError, match="num_layers"):
        is_bf16_edge_layer(5, cfg)


def test_config_check_rejects_nvfp4_without_hardware_support():
    for system in ("h100-sxm", "h200-sxm"):
        cfg = load_config(GB200, validate=False, overrides={  # a layout valid on 8-GPU nodes
            "system": {"id": system, "racks": 64}, "parallel": {"tp": 8, "pp": 1, "cp": 1, "vp": 1}})
        assert any("nvfp4 needs a Blackwell GPU" in p for p in problems(cfg)), problems(cfg)
        with pytest.raises(ConfigError, match="nvfp4 needs a Blackwell GPU"):
            validate(cfg)
    assert load_config(GB200).precision.compute == "nvfp4"          # GB200: native
    assert _tiny(compute="nvfp4").precision.compute == "nvfp4"      # CPU: emulated
    with pytest.raises(ConfigError, match="nvfp4_tp_amax"):
        load_config(GB200, overrides={"precision": {"nvfp4_tp_amax": "tensor"}})
    assert _tiny(compute="nvfp4", nvfp4_tp_amax="tensor").precision.nvfp4_tp_amax == "tensor"


def test_transformer_config_kwargs():
    # megatron-core refuses fp8_param without fp8 compute: NVFP4 parameters are fp4_param
    fp8_params = {"performance": {"fp8_param_gather": True, "fp4_param_gather": False}}
    with pytest.raises(ConfigError, match="fp4_param_gather"):     # config check says it first
        load_config(GB200, overrides=fp8_params)
    with pytest.raises(RecipeEnvError, match="fp4_param_gather"):  # and the recipe refuses it too
        transformer_config_kwargs(load_config(GB200, validate=False, overrides=fp8_params))
    perf = {"fp8_param_gather": False, "fp4_param_gather": True}   # NVFP4 gather: 2D weights
    cfg = load_config(GB200, overrides={"performance": perf, "precision": {"nvfp4_2d_weights": True}})
    kw = transformer_config_kwargs(cfg)
    assert kw["fp4"] == "e2m1" and kw["fp4_recipe"] == "nvfp4" and kw["fp8"] is None
    assert kw["fp4_param"] is True and kw["fp8_param"] is False
    assert kw["first_last_layers_bf16"] is False and kw["bf16"] is True
    assert kw["params_dtype"] == torch.bfloat16 and kw["fp8_dot_product_attention"] is False
    edges = load_config(GB200, overrides={"performance": perf, "precision": {
        "bf16_layers_at_start": 2, "bf16_layers_at_end": 8, "nvfp4_2d_weights": True}})
    kw = transformer_config_kwargs(edges)
    assert kw["first_last_layers_bf16"] is True
    assert (kw["num_layers_at_start_in_bf16"], kw["num_layers_at_end_in_bf16"]) == (2, 8)
    fp32 = transformer_config_kwargs(load_config(TINY))
    assert fp32["fp4"] is None and fp32["fp8"] is None and fp32["params_dtype"] == torch.float32
    # every key is a TransformerConfig field of the installed megatron-core (read from source:
    # importing megatron costs seconds; tests/nvfp4_dist_worker.py builds a real TransformerConfig)
    assert set(kw) <= _megatron_config_fields()


def _megatron_config_fields() -> set[str]:
    import ast
    import importlib.util
    base = Path(importlib.util.find_spec("megatron.core").origin).parent
    fields: set[str] = set()
    for rel, cls in (("transformer/transformer_config.py", "TransformerConfig"),
                     ("model_parallel_config.py", "ModelParallelConfig")):
        tree = ast.parse((base / rel).read_text())
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        fields |= {a.target.id for a in node.body
                   if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)}
    return fields


def test_require_te_env():
    cfg = load_config(GB200)
    env = launch_env(cfg)
    assert env["NVTE_NVFP4_DISABLE_RHT"] == "1"           # the submissions' "vanilla" NVFP4
    got = require_te_env(cfg, environ=env)
    assert set(got) == {"NVTE_NVFP4_DISABLE_RHT", "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING",
                        "NVTE_NVFP4_DISABLE_2D_QUANTIZATION", "NVTE_DPA_FP8_RECIPE",
                        "NVTE_NORM_FWD_USE_CUDNN", "NVTE_NORM_BWD_USE_CUDNN"}   # kernel knobs
    bad = dict(env, NVTE_NVFP4_DISABLE_RHT="0")
    del bad["NVTE_NVFP4_DISABLE_2D_QUANTIZATION"]
    with pytest.raises(RecipeEnvError, match=r"DISABLE_2D_QUANTIZATION=1 \(missing\).*"
                                             r"DISABLE_RHT=1 \(found '0'\)"):
        require_te_env(cfg, environ=bad)
    assert require_te_env(load_config(TINY), environ={}) == {}       # fp32: nothing to check


# one knob of each kind TE 2.20.2 reads for the GB200 recipe (NVFP4 + BF16 attention) and
# the proven run's TE 2.8 did not have, or had and left at its default
@pytest.mark.parametrize("name,value", [("NVTE_NVFP4_4OVER6", "weights"),
                                        ("NVTE_NVFP4_ROW_SCALED_ACTIVATION", "1"),
                                        ("NVTE_BACKWARD_OVERRIDE", "dequantized"),
                                        ("NVTE_DPA_FP8DS_AMAX_HISTLEN", "16")])
def test_a_stray_recipe_knob_stops_the_run_unless_the_config_sets_it(name, value):
    cfg = load_config(GB200)
    stray = dict(launch_env(cfg), **{name: value})
    with pytest.raises(RecipeEnvError, match=rf"{name} is set to '{value}' but must be unset"):
        require_te_env(cfg, environ=stray)
    on_purpose = load_config(GB200, overrides={"env": {name: value}})
    assert require_te_env(on_purpose, environ=launch_env(on_purpose))[name] == value
    with pytest.raises(RecipeEnvError, match=rf"{name}={value} \(missing\)"):
        require_te_env(on_purpose, environ=launch_env(cfg))


def test_the_pinned_knobs_follow_the_recipe():
    from llama31_405b.precision.te_recipe import TE_RECIPE_KNOBS, expected_te_env, te_recipes
    gb200 = expected_te_env(load_config(GB200))
    # the proven run's values where it set one (docs/gpu_settings.md), unset everywhere else
    assert {k: v for k, v in gb200.items() if v is not None} == {
        "NVTE_NVFP4_DISABLE_RHT": "1", "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING": "1",
        "NVTE_NVFP4_DISABLE_2D_QUANTIZATION": "1", "NVTE_DPA_FP8_RECIPE": "F16"}
    assert {"NVTE_NVFP4_4OVER6", "NVTE_NVFP4_4OVER6_E4M3_USE_256", "NVTE_NVFP4_4OVER6_ERR_MODE",
            "NVTE_NVFP4_ROW_SCALED_ACTIVATION", "NVTE_BACKWARD_OVERRIDE",
            "NVTE_DPA_FP8_FORMAT"} <= set(gb200)
    assert "NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES" not in gb200     # no current scaling here
    h100 = load_config(ROOT / "configs" / "config_H100_512x8x64xtp4pp16cp4.toml")
    assert "DelayedScaling" in te_recipes(h100)
    fp8 = expected_te_env(h100)
    assert not any(k.startswith("NVTE_NVFP4") for k in fp8)
    assert fp8["NVTE_BACKWARD_OVERRIDE"] is None and "NVTE_UNFUSED_FP8_UPDATE" in fp8
    # NVFP4 linear layers with FP8 attention: TE's attention builds current + delayed scaling
    fp8_attn = load_config(GB200, overrides={"precision": {"attention": "fp8"}}, validate=False)
    assert expected_te_env(fp8_attn)["NVTE_DPA_FP8_FORMAT"] == "HYBRID"
    assert "NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES" in expected_te_env(fp8_attn)
    assert set(expected_te_env(fp8_attn)) == set(TE_RECIPE_KNOBS)
    assert te_recipes(load_config(TINY)) == set()


def test_the_knob_list_is_what_transformer_engine_reads():
    """Where TE 2.20.2's sources are installed (GPU images), every os.getenv of its recipe
    classes is in TE_RECIPE_KNOBS; skipped without them."""
    import importlib.util
    import re
    from llama31_405b.precision.te_recipe import TE_RECIPE_KNOBS
    spec = importlib.util.find_spec("transformer_engine")
    if spec is None or spec.origin is None:
        pytest.skip("Transformer Engine is not installed (GPU images only)")
    recipe = Path(spec.origin).parent / "common" / "recipe" / "__init__.py"
    read = set(re.findall(r'os\.getenv\("(NVTE_[A-Z0-9_]+)"', recipe.read_text()))
    assert read - {"NVTE_FP8_BLOCK_SCALING_FP32_SCALES"} <= set(TE_RECIPE_KNOBS)
