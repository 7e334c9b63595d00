"""The attention-backend switches megatron-core 0.19.2 writes at every model build
(`LanguageModule._set_attention_backend`, run by `LanguageModule.__init__`) against the
Transformer Engine environment check (`precision.te_recipe.require_te_env`): a process that has
built a GPTModel (first contact's phases before `Run._init`) or was started by one (its dp2
ranks) carries them, and must pass; a user's other value must still be refused by name.

megatron's own method runs here on the TransformerConfig the builder makes for a GPU with TE
(the GB200 and HGX H200 configs), in a monkeypatched environment."""
from __future__ import annotations

import types
from pathlib import Path

import pytest

from helpers.pretend_gpu import pretend_gpu_with_te
from llama31_405b.config import launch_env, load_config
from llama31_405b.precision import te_recipe
from llama31_405b.precision.attention_env import (ATTENTION_BACKEND, FLASH_ATTENTION_VERSION,
                                                  MEGATRON_ATTENTION_KNOBS,
                                                  megatron_attention_env)

REPO = Path(__file__).resolve().parents[1]
GB200 = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"
H200 = REPO / "configs" / "config_H200_64x8x120xtp4pp8cp2.toml"
_ALL = (*MEGATRON_ATTENTION_KNOBS, "NVTE_FLASH_ATTN_V2", "NVTE_FLASH_ATTN_V3",
        "NVTE_FLASH_ATTN_V4")


def _set_attention_backend(tcfg) -> None:
    """megatron-core 0.19.2's own `LanguageModule._set_attention_backend` (it reads only
    `self.config`) for TransformerConfig `tcfg`."""
    from megatron.core.models.common.language_module.language_module import LanguageModule
    holder = types.SimpleNamespace(config=tcfg)
    LanguageModule._set_attention_backend(holder)  # type: ignore[arg-type]


@pytest.fixture
def clean_env(monkeypatch):
    """No attention switch in the environment (restored afterwards: megatron writes os.environ)."""
    import os
    for k in _ALL:
        monkeypatch.delenv(k, raising=False)
    return os.environ


def test_the_rule_is_megatrons_for_every_backend_and_flash_version(clean_env, monkeypatch):
    from megatron.core.transformer.enums import AttnBackend
    for backend in AttnBackend:
        for version in (None, 2, 3, 4):
            for k in _ALL:
                monkeypatch.delenv(k, raising=False)
            _set_attention_backend(types.SimpleNamespace(attention_backend=backend,
                                                         flash_attention_version=version))
            got = {k: clean_env[k] for k in _ALL if k in clean_env}
            assert got == megatron_attention_env(backend.name, version), (backend, version)
    with pytest.raises(ValueError, match="AttnBackend has flash, fused, unfused, local, auto"):
        megatron_attention_env("sdpa")


@pytest.mark.parametrize("path", [GB200, H200], ids=["GB200", "H200"])
def test_a_process_that_built_the_model_passes_the_check(path, clean_env, monkeypatch):
    """The builder's TransformerConfig (GPU, TE) keeps megatron's default backend, which the
    check assumes; after megatron's model-build step wrote its switches (all "1" for auto), the
    launch environment still passes, in this process and in one that inherits it (dp2)."""
    cfg = load_config(path)
    tcfg = pretend_gpu_with_te(monkeypatch).transformer_config(cfg)
    assert tcfg.attention_backend.name == ATTENTION_BACKEND == "auto"
    assert tcfg.flash_attention_version == FLASH_ATTENTION_VERSION
    for k, v in launch_env(cfg).items():
        monkeypatch.setenv(k, v)
    te_recipe.require_te_env(cfg)                        # before the build: none set
    _set_attention_backend(tcfg)
    assert {k: clean_env.get(k) for k in MEGATRON_ATTENTION_KNOBS} == dict.fromkeys(
        MEGATRON_ATTENTION_KNOBS, "1")
    te_recipe.require_te_env(cfg)                        # after it (Run._init after the build)
    te_recipe.require_te_env(cfg, environ=dict(clean_env))   # a child process (dp2)
    _set_attention_backend(tcfg)                         # a second build is accepted by megatron
    rec = te_recipe.te_kernel_record()
    assert rec["megatron_attention_backend"] == "auto"
    assert rec["set_by_megatron"] == "NVTE_FLASH_ATTN=1 NVTE_FUSED_ATTN=1 NVTE_UNFUSED_ATTN=1"
    assert te_recipe.te_kernel_line(rec).endswith(
        "NVTE_NORM_BWD_USE_CUDNN=1, NVTE_FLASH_ATTN=1, NVTE_FUSED_ATTN=1, NVTE_UNFUSED_ATTN=1 "
        "(set by megatron-core for attention_backend auto)")


@pytest.mark.parametrize("path", [GB200, H200], ids=["GB200", "H200"])
def test_a_users_other_value_is_refused_by_name(path, clean_env, monkeypatch):
    """NVTE_FUSED_ATTN=0 in the job's environment: megatron's check asserts at the build (after
    it has written NVTE_FLASH_ATTN); the TE check refuses it by name, before and after."""
    cfg = load_config(path)
    tcfg = pretend_gpu_with_te(monkeypatch).transformer_config(cfg)
    for k, v in launch_env(cfg).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    refused = r"NVTE_FUSED_ATTN is set to '0' but must be unset or '1'.*_set_attention_backend"
    with pytest.raises(te_recipe.RecipeEnvError, match=refused):
        te_recipe.require_te_env(cfg)
    with pytest.raises(AssertionError, match="NVTE_FUSED_ATTN set to 0, but expected 1"):
        _set_attention_backend(tcfg)
    assert clean_env["NVTE_FLASH_ATTN"] == "1" and clean_env["NVTE_FUSED_ATTN"] == "0"
    with pytest.raises(te_recipe.RecipeEnvError, match=refused) as e:
        te_recipe.require_te_env(cfg)
    assert "NVTE_FLASH_ATTN" not in str(e.value)          # megatron's own value is accepted
    line = te_recipe.te_kernel_line(te_recipe.te_kernel_record())
    assert "NVTE_FUSED_ATTN=0, NVTE_FLASH_ATTN=1 (set by megatron-core" in line


def test_a_config_value_megatron_would_refuse_is_refused(clean_env):
    off = load_config(GB200, overrides={"env": {"NVTE_UNFUSED_ATTN": "0"}})
    with pytest.raises(te_recipe.RecipeEnvError,
                       match=r"NVTE_UNFUSED_ATTN=0 in the config's \[env\] table conflicts.*"
                             r"sets NVTE_UNFUSED_ATTN=1 for attention_backend auto"):
        te_recipe.require_te_env(off, environ=launch_env(off))
    on = load_config(GB200, overrides={"env": {"NVTE_UNFUSED_ATTN": "1"}})
    assert te_recipe.require_te_env(on, environ=launch_env(on))["NVTE_UNFUSED_ATTN"] == "1"
