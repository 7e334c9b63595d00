"""The builder on a pretend GPU machine, on the CPU: `systems.device` sees CUDA, and the optional
modules `model.builder` asks for are the given ones. With Transformer Engine, only what
megatron-core 0.19.2's TransformerConfig.__post_init__ asks of TE is stood in for (TE's fused
RoPE function and its version, 2.20.2); TE's layers themselves cannot be built here."""
from __future__ import annotations

from types import ModuleType


def pretend_gpu(monkeypatch, modules: tuple[str, ...]) -> ModuleType:
    """Patch for a GPU process whose importable optional modules are `modules` (e.g.
    ("transformer_engine", "fused_weight_gradient_mlp_cuda") for the project's image, () for a
    bare GPU machine); returns `llama31_405b.model.builder`."""
    import llama31_405b.model.builder as builder
    import llama31_405b.systems.device as device
    monkeypatch.setattr(device, "cuda_visible", lambda: True)
    monkeypatch.setattr(builder, "_has_module", lambda name: name in modules)
    if "transformer_engine" in modules:
        from packaging.version import Version

        import megatron.core.models.common.embeddings.rope_utils as rope_utils
        import megatron.core.transformer.transformer_config as tc_mod
        te = Version("2.20.2")
        monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda *a, **k: None)
        monkeypatch.setattr(tc_mod, "is_te_min_version",
                            lambda v, check_equality=True: te >= Version(v) if check_equality
                            else te > Version(v))
        monkeypatch.setattr(tc_mod, "get_te_version", lambda: te)
    return builder


def pretend_gpu_with_te(monkeypatch) -> ModuleType:
    """The project's image: Transformer Engine 2.20.2 and Apex's fused_weight_gradient_mlp_cuda
    installed; Apex's masked-softmax kernels absent."""
    import llama31_405b.model.builder as builder
    return pretend_gpu(monkeypatch, ("transformer_engine", builder.GRAD_ACCUM_FUSION_MODULE))
