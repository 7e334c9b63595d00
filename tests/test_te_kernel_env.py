"""Transformer Engine's kernel-choice environment (precision.te_recipe.TE_KERNEL_KNOBS): the
attention backend switches, determinism, fused softmax, torch.compile and cuDNN's norm kernels
are unset unless the config's [env] table sets them, refused by name otherwise (the attention
switches megatron-core writes at the model build: tests/test_megatron_attention_env.py); CP's
P2P batching is unset (TE's default) in every GB200 config; the record of
what TE chose (attention backend, norm settings) that first-contact and a training run print.

TE is not installed on the CPU: the record is tested on a stand-in for the one TE 2.20.2 module
attribute it reads (`_attention_backends` of
transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention)."""
import sys
import types
from pathlib import Path

import pytest

from llama31_405b.config import launch_env, load_config
from llama31_405b.precision.attention_env import MEGATRON_ATTENTION_KNOBS
from llama31_405b.precision.te_recipe import (NORM_KNOBS, TE_KERNEL_KNOBS, RecipeEnvError,
                                              expected_kernel_env, require_te_env,
                                              te_attention_backend, te_kernel_line,
                                              te_kernel_record)

ROOT = Path(__file__).resolve().parents[1]
GB200 = ROOT / "configs" / "config_GB200_512x4x32xtp4pp8cp2.toml"
LISTED = {"NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN", "NVTE_FLASH_ATTN_V2",
          "NVTE_FLASH_ATTN_V3", "NVTE_FLASH_ATTN_V4", "NVTE_FUSED_ATTN_USE_FAv2_BWD",
          "NVTE_APPLY_QK_LAYER_SCALING", "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
          "NVTE_MASKED_SOFTMAX_FUSION", "NVTE_TORCH_COMPILE", "NVTE_BATCH_MHA_P2P_COMM",
          *NORM_KNOBS}


def test_the_knobs_are_the_ones_te_reads_for_its_kernels():
    assert set(TE_KERNEL_KNOBS) == LISTED
    assert all("transformer_engine" in where for where in TE_KERNEL_KNOBS.values())


def test_the_norm_switches_follow_the_config():
    cfg = load_config(GB200)
    want = expected_kernel_env(cfg)
    assert {k: v for k, v in want.items() if v is not None} == {
        "NVTE_NORM_FWD_USE_CUDNN": "1", "NVTE_NORM_BWD_USE_CUDNN": "1"}
    env = launch_env(cfg)
    assert require_te_env(cfg, environ=env)["NVTE_NORM_FWD_USE_CUDNN"] == "1"
    for name, found in (("NVTE_NORM_FWD_USE_CUDNN", "0"), ("NVTE_NORM_BWD_USE_CUDNN", None)):
        bad = dict(env)
        if found is None:
            del bad[name]
        else:
            bad[name] = found
        msg = rf"{name}=1 \(" + ("missing" if found is None else f"found '{found}'") + r"\)"
        with pytest.raises(RecipeEnvError, match=msg):
            require_te_env(cfg, environ=bad)
    off = load_config(GB200, overrides={"env": {"NVTE_NORM_FWD_USE_CUDNN": "0"}})
    assert require_te_env(off, environ=launch_env(off))["NVTE_NORM_FWD_USE_CUDNN"] == "0"


@pytest.mark.parametrize("name,value", [("NVTE_FLASH_ATTN", "0"), ("NVTE_FUSED_ATTN", "0"),
                                        ("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0"),
                                        ("NVTE_TORCH_COMPILE", "0"),
                                        ("NVTE_FUSED_ATTN_USE_FAv2_BWD", "1"),
                                        ("NVTE_BATCH_MHA_P2P_COMM", "1")])
def test_a_stray_kernel_knob_is_refused_by_name_unless_the_config_sets_it(name, value):
    cfg = load_config(GB200)
    stray = dict(launch_env(cfg), **{name: value})
    with pytest.raises(RecipeEnvError, match=rf"{name} is set to '{value}' but must be unset.*"
                                             rf"read by transformer_engine"):
        require_te_env(cfg, environ=stray)
    on_purpose = load_config(GB200, overrides={"env": {name: value}})
    if name in MEGATRON_ATTENTION_KNOBS:   # megatron-core writes "1" at the build (auto) and
        with pytest.raises(RecipeEnvError, match=rf"{name}={value} in the config's \[env\]"):
            require_te_env(on_purpose, environ=launch_env(on_purpose))   # refuses another
        return                             # (tests/test_megatron_attention_env.py)
    assert require_te_env(on_purpose, environ=launch_env(on_purpose))[name] == value


def test_cp_p2p_batching_is_pinned_to_te_s_default_and_recorded():
    """NVTE_BATCH_MHA_P2P_COMM (TE 2.20.2 AttnFuncWithCPAndKVP2P, CP 2 in every GB200 config):
    unset in every GB200 config (TE's default, as the proven run's recorded environment),
    refused when set otherwise, shown in the kernel record when set."""
    assert "AttnFuncWithCPAndKVP2P.forward" in TE_KERNEL_KNOBS["NVTE_BATCH_MHA_P2P_COMM"]
    for path in sorted(GB200.parent.glob("config_GB200_*.toml")):
        cfg = load_config(path)
        assert cfg.parallel.cp == 2
        assert expected_kernel_env(cfg)["NVTE_BATCH_MHA_P2P_COMM"] is None
        assert "NVTE_BATCH_MHA_P2P_COMM" not in launch_env(cfg)
    cfg = load_config(GB200)
    with pytest.raises(RecipeEnvError, match="NVTE_BATCH_MHA_P2P_COMM is set to '0'"):
        require_te_env(cfg, environ=dict(launch_env(cfg), NVTE_BATCH_MHA_P2P_COMM="0"))
    rec = te_kernel_record({"NVTE_BATCH_MHA_P2P_COMM": "1"})
    assert rec["NVTE_BATCH_MHA_P2P_COMM"] == "1"
    assert te_kernel_line(rec).endswith("NVTE_BATCH_MHA_P2P_COMM=1")
    assert te_kernel_record({})["NVTE_BATCH_MHA_P2P_COMM"] is None


def test_the_record_shows_the_selected_backend_and_the_norm_settings(monkeypatch):
    name = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"
    env = {"NVTE_NORM_FWD_USE_CUDNN": "1", "NVTE_NORM_BWD_USE_CUDNN": "1"}
    monkeypatch.delitem(sys.modules, name, raising=False)
    assert te_attention_backend() is None                       # TE not imported
    rec = te_kernel_record(env)
    assert rec["attention_backend"] is None and rec["NVTE_NORM_FWD_USE_CUDNN"] == "1"
    assert te_kernel_line(rec) == ("Transformer Engine kernels: attention backend not selected "
                                   "yet, NVTE_NORM_FWD_USE_CUDNN=1, NVTE_NORM_BWD_USE_CUDNN=1")
    mod = types.ModuleType(name)
    mod._attention_backends = {"attention_params": None, "use_flash_attention": None,
                               "use_fused_attention": None, "use_unfused_attention": None}
    monkeypatch.setitem(sys.modules, name, mod)
    assert te_attention_backend() is None                       # no attention forward yet
    mod._attention_backends.update(attention_params=object(), use_flash_attention=False,
                                   use_fused_attention=True, use_unfused_attention=True,
                                   fused_attention_backend="NVTE_F16_arbitrary_seqlen")
    assert te_attention_backend() == "FusedAttention (sub-backend NVTE_F16_arbitrary_seqlen)"
    line = te_kernel_line(te_kernel_record({"NVTE_FLASH_ATTN": "0"}))
    assert line == ("Transformer Engine kernels: attention backend FusedAttention (sub-backend "
                    "NVTE_F16_arbitrary_seqlen), NVTE_NORM_FWD_USE_CUDNN=<unset>, "
                    "NVTE_NORM_BWD_USE_CUDNN=<unset>, NVTE_FLASH_ATTN=0")


def test_te_reads_the_p2p_knob_where_the_table_says():
    """TE 2.20.2's sources (fetched by `make typecheck` into .cache/te-2.20.2): both methods of
    AttnFuncWithCPAndKVP2P read NVTE_BATCH_MHA_P2P_COMM, default "0"."""
    import ast
    from helpers.source_index import TE_ROOT, te_tree
    te_tree()                                  # fetched when this clone lacks them, never skipped
    src = (TE_ROOT / "transformer_engine" / "pytorch" / "attention" / "dot_product_attention"
           / "context_parallel.py")
    text = src.read_text()
    cls = next(n for n in ast.parse(text).body
               if isinstance(n, ast.ClassDef) and n.name == "AttnFuncWithCPAndKVP2P")
    methods = {n.name: ast.get_source_segment(text, n) or "" for n in cls.body
               if isinstance(n, ast.FunctionDef)}
    for name in ("forward", "backward"):
        assert 'os.getenv("NVTE_BATCH_MHA_P2P_COMM", "0")' in methods[name], name
