"""Every GPU configuration's model built through megatron-core 0.19.2's constructors on the CPU,
with the TransformerConfig flags the builder sets for a GPU device (persist_layer_norm,
bias_activation_fusion, bias_dropout_fusion, masked_softmax_fusion, cross_entropy_loss_fusion,
...), so that megatron's constructor assertions against them run in CI.

- Without Transformer Engine (a bare GPU machine such as the H200 test machine: bench/gpu_layer.py,
  first contact's layer phase and slice): the local spec, whose RMSNorm is megatron's
  `WrappedTorchNorm` (megatron-core 0.19.2 `LocalSpecProvider.layer_norm`, and the block's final
  norm from `transformer_block`'s LayerNormImpl), which asserts `not config.persist_layer_norm`.
  The model is shrunk (width 64, 2 layers, TP = PP = CP = 1, BF16 compute: what the no-TE path
  accepts) and initialised on the CPU (`use_cpu_initialization`, which the builder keys on the
  device, is the one field changed after the builder).
- With Transformer Engine: the project has no stand-in for TE's modules
  (tests/helpers/pretend_gpu.py stands in only for what TransformerConfig asks of TE: its
  version and fused RoPE), and TE's layers need TE's compiled library, so the TE spec cannot be
  built here. Its TransformerConfig,
  full size, goes through megatron's own validation for every GPU configuration instead.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers.pretend_gpu import pretend_gpu, pretend_gpu_with_te
from llama31_405b.config import load_config
from llama31_405b.systems import load_system

REPO = Path(__file__).resolve().parents[1]


def _gpu_configs() -> list[Path]:
    out = []
    for path in sorted((REPO / "configs").glob("*.toml")):
        if load_system(load_config(path, validate=False).system.id).is_gpu:
            out.append(path)
    return out


GPU_CONFIGS = _gpu_configs()

# shrunk to build in well under a second; everything the no-TE GPU path accepts stays the config's
SMALL: dict[str, dict[str, Any]] = {
    "model": {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128,
              "num_attention_heads": 4, "num_query_groups": 2, "kv_channels": 16,
              "vocab_size": 256, "seq_length": 64},
    "parallel": {"tp": 1, "pp": 1, "vp": 1, "cp": 1, "sequence_parallel": False},
    # TE-only settings (model.builder._te_path refuses them without TE)
    "precision": {"compute": "bf16", "attention": "bf16"},
    "performance": {"tp_comm_overlap": False, "fp8_param_gather": False,
                    "fp4_param_gather": False,
                    # needs Apex's extension, refused before the build without it (test_gpu_path)
                    "gradient_accumulation_fusion": False,
                    # PP 1
                    "account_for_embedding_in_pipeline_split": False,
                    "account_for_loss_in_pipeline_split": False},
}


def test_every_gpu_system_config_is_found():
    names = {p.name.split("_")[1] for p in GPU_CONFIGS}
    assert names == {"GB200", "DGXB200", "H100", "H200"}, names
    assert len(GPU_CONFIGS) >= 18


@pytest.fixture(scope="module")
def one_rank():
    """Megatron's parallel state for one rank (TP = PP = CP = 1) on torch's fake backend."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.testing._internal.distributed.fake_pg import FakeStore
    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        ps.initialize_model_parallel(create_gloo_process_groups=False)
        yield
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


def _build_without_te(monkeypatch, path: Path, modules: tuple[str, ...] = ()):
    import os

    from llama31_405b.systems.device import decide
    for k in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"):
        monkeypatch.delenv(k, raising=False)     # GPTModel writes them (restored afterwards)
    builder = pretend_gpu(monkeypatch, modules)
    cfg = load_config(path, validate=False, overrides=SMALL)
    if cfg.performance.cuda_graphs == "layers":   # per-layer graphs are TE's
        cfg = load_config(path, validate=False,
                          overrides={**SMALL, "performance": {**SMALL["performance"],
                                                              "cuda_graphs": "none"}})
    device = decide(cfg)
    assert device.gpu
    tcfg = builder.transformer_config(cfg, device=device)
    # the GPU-only flags the builder sets (the point of building on a pretend GPU)
    assert tcfg.bias_activation_fusion and tcfg.bias_dropout_fusion
    assert tcfg.cross_entropy_loss_fusion and tcfg.deallocate_pipeline_outputs
    assert tcfg.masked_softmax_fusion == ("scaled_masked_softmax_cuda" in modules)
    assert not tcfg.apply_rope_fusion and not tcfg.use_cpu_initialization
    assert builder.layer_spec(cfg, device=device).submodules.input_layernorm is not None
    tcfg.use_cpu_initialization = True            # the CPU holds the weights
    chunks = builder.build_model(cfg, config=tcfg, device=device)
    assert os.environ["NVTE_FLASH_ATTN"] == "1"   # megatron's _set_attention_backend ran
    return cfg, chunks


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=[p.stem for p in GPU_CONFIGS])
def test_the_local_spec_model_builds_on_a_gpu_without_te(one_rank, monkeypatch, path):
    from megatron.core.models.gpt import GPTModel
    from torch.nn import RMSNorm
    cfg, chunks = _build_without_te(monkeypatch, path)
    (model,) = chunks
    assert isinstance(model, GPTModel) and len(model.decoder.layers) == 2
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 2 * 2 + 1             # WrappedTorchNorm: 2 per layer + the final one
    assert model.decoder.final_layernorm in norms


def test_with_apex_softmax_kernels_the_local_attention_takes_them(one_rank, monkeypatch):
    """masked_softmax_fusion (Apex's scaled_masked_softmax_cuda present) reaches megatron's local
    attention, whose FusedScaleMaskSoftmax is built with it."""
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    _, (model,) = _build_without_te(monkeypatch, GPU_CONFIGS[0], ("scaled_masked_softmax_cuda",))
    soft = [m for m in model.modules() if isinstance(m, FusedScaleMaskSoftmax)]
    assert soft and all(m.scaled_masked_softmax_fusion for m in soft)


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=[p.stem for p in GPU_CONFIGS])
def test_the_te_path_transformer_config_is_accepted(monkeypatch, path):
    """With TE (the project's image): the full-size TransformerConfig of every GPU config passes
    megatron's __post_init__, with the TE-only flags (the TE spec itself needs TE's library)."""
    builder = pretend_gpu_with_te(monkeypatch)
    cfg = load_config(path)
    t = builder.transformer_config(cfg)
    assert t.persist_layer_norm and t.apply_rope_fusion and t.bias_activation_fusion
    assert not t.use_cpu_initialization
