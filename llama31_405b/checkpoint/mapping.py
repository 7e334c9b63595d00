"""Hugging Face Llama tensors -> Megatron GPTModel tensors: names, shapes, fusions, checks.

Pure logic (torch only for the fusions). Megatron tensors are identified by their *canonical*
sharded-state-dict key plus the global layer index: the key is what a distributed checkpoint
stores, and it is the same for Megatron's local layer spec (CPU) and the Transformer Engine spec
(GPU), because the local spec maps `input_layernorm.` -> `self_attention.linear_qkv.layer_norm_`
and `pre_mlp_layernorm.` -> `mlp.linear_fc1.layer_norm_` (gpt_layer_specs.py).

Layouts:
- linear_qkv rows, per query group g (of num_query_groups): the q heads of group g
  (heads/groups heads of kv_channels rows each), then k_g, then v_g. This is how Megatron's
  SelfAttention splits the fused projection, and Hugging Face's GQA pairs query head i with
  kv head i // (heads/groups), so the groups line up. Both use the rotate-half RoPE layout
  (Megatron's rotary_interleaved=False), so q/k need no permutation.
- linear_fc1 rows: [gate; up] (Megatron's SwiGLU chunks fc1 output into gate, up).
- The vocab dimension is written at the model's true vocab (the checkpoint's rows); Megatron
  marks the embedding and output layer `allow_shape_mismatch`, zero-fills each rank's padded
  shard and reads the stored rows into it, so one checkpoint loads at every TP's padding.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config.schema import ModelConfig

EMBED = "embedding.word_embeddings.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
OUTPUT = "output_layer.weight"
QKV = "decoder.layers.self_attention.linear_qkv.weight"
PROJ = "decoder.layers.self_attention.linear_proj.weight"
ATTN_NORM = "decoder.layers.self_attention.linear_qkv.layer_norm_weight"
FC1 = "decoder.layers.mlp.linear_fc1.weight"
FC2 = "decoder.layers.mlp.linear_fc2.weight"
MLP_NORM = "decoder.layers.mlp.linear_fc1.layer_norm_weight"

SOURCE_DTYPES = ("BF16", "F16", "F32")
"""safetensors dtypes accepted as weights (anything else, e.g. FP8 or int8, is refused)."""

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
"""Buffers some older Hugging Face exports store; recomputed by the model, not converted."""


MAX_LISTED = 12
"""Shape/dtype problems listed by name before the rest are counted (405B has 1,137 tensors)."""


class ConversionError(ValueError):
    """The inputs do not fit together; raised before anything is written."""


@dataclass(frozen=True, slots=True)
class Target:
    """One Megatron tensor (one layer's slice for decoder tensors) and where it comes from."""
    key: str
    """Canonical sharded key (same in the local and the TE layer spec)."""
    layer: int | None
    """Global decoder layer index; None for embedding, final norm and output layer."""
    sources: tuple[str, ...]
    """Hugging Face tensor names, in fusion order."""
    shape: tuple[int, ...]
    """Shape of the full (TP1) Megatron tensor for this layer."""

    @property
    def label(self) -> str:
        return self.key if self.layer is None else f"{self.key}[layer {self.layer}]"


def hf_layer(i: int, leaf: str) -> str:
    return f"model.layers.{i}.{leaf}.weight"


def targets(m: ModelConfig) -> list[Target]:
    """Every Megatron tensor of the model in checkpoint order, with its Hugging Face sources."""
    h, f, d = m.hidden_size, m.ffn_hidden_size, m.kv_channels
    qkv_rows = (m.num_attention_heads + 2 * m.num_query_groups) * d
    out = [Target(key=EMBED, layer=None, sources=("model.embed_tokens.weight",),
                  shape=(m.vocab_size, h))]
    for i in range(m.num_layers):
        L = lambda leaf: hf_layer(i, leaf)  # noqa: E731
        out += [
            Target(key=ATTN_NORM, layer=i, sources=(L("input_layernorm"),), shape=(h,)),
            Target(key=QKV, layer=i, shape=(qkv_rows, h),
                   sources=(L("self_attn.q_proj"), L("self_attn.k_proj"), L("self_attn.v_proj"))),
            Target(key=PROJ, layer=i, sources=(L("self_attn.o_proj"),),
                   shape=(h, m.num_attention_heads * d)),
            Target(key=MLP_NORM, layer=i, sources=(L("post_attention_layernorm"),), shape=(h,)),
            Target(key=FC1, layer=i, sources=(L("mlp.gate_proj"), L("mlp.up_proj")),
                   shape=(2 * f, h)),
            Target(key=FC2, layer=i, sources=(L("mlp.down_proj"),), shape=(h, f)),
        ]
    out += [Target(key=FINAL_NORM, layer=None, sources=("model.norm.weight",), shape=(h,)),
            Target(key=OUTPUT, layer=None, sources=("lm_head.weight",), shape=(m.vocab_size, h))]
    return out


def expected_hf_shapes(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a Hugging Face Llama of this config holds."""
    h, f, d = m.hidden_size, m.ffn_hidden_size, m.kv_channels
    q, kv = m.num_attention_heads * d, m.num_query_groups * d
    shapes = {"model.embed_tokens.weight": (m.vocab_size, h), "model.norm.weight": (h,),
              "lm_head.weight": (m.vocab_size, h)}
    for i in range(m.num_layers):
        shapes.update({
            hf_layer(i, "input_layernorm"): (h,), hf_layer(i, "post_attention_layernorm"): (h,),
            hf_layer(i, "self_attn.q_proj"): (q, h), hf_layer(i, "self_attn.k_proj"): (kv, h),
            hf_layer(i, "self_attn.v_proj"): (kv, h), hf_layer(i, "self_attn.o_proj"): (h, q),
            hf_layer(i, "mlp.gate_proj"): (f, h), hf_layer(i, "mlp.up_proj"): (f, h),
            hf_layer(i, "mlp.down_proj"): (h, f),
        })
    return shapes


def _config_problems(hf_config: dict, m: ModelConfig, where: str) -> list[str]:
    """Hyperparameters that tensor shapes cannot reveal (heads, RoPE, epsilon, tying)."""
    problems = []

    def cmp(hf_key: str, ours, field: str, tol: float = 0.0):
        if hf_key not in hf_config or hf_config[hf_key] is None:
            return
        theirs = hf_config[hf_key]
        differs = (abs(float(theirs) - float(ours)) > tol * max(abs(float(ours)), 1.0)
                   if isinstance(ours, float) else theirs != ours)
        if differs:
            problems.append(f"{where}: {hf_key} = {theirs!r} but the config has "
                            f"model.{field} = {ours!r}")

    cmp("num_hidden_layers", m.num_layers, "num_layers")
    cmp("hidden_size", m.hidden_size, "hidden_size")
    cmp("intermediate_size", m.ffn_hidden_size, "ffn_hidden_size")
    cmp("num_attention_heads", m.num_attention_heads, "num_attention_heads")
    cmp("num_key_value_heads", m.num_query_groups, "num_query_groups")
    cmp("head_dim", m.kv_channels, "kv_channels")
    cmp("vocab_size", m.vocab_size, "vocab_size")
    # transformers < 5 writes rope_theta + rope_scaling; >= 5 one rope_parameters table
    rope = hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {}
    if "rope_theta" not in hf_config and "rope_theta" in rope:
        hf_config = {**hf_config, "rope_theta": rope["rope_theta"]}
    cmp("rope_theta", m.rope_base, "rope_base", 1e-9)
    cmp("rms_norm_eps", m.norm_epsilon, "norm_epsilon", 1e-9)
    if hf_config.get("tie_word_embeddings"):
        problems.append(f"{where}: tie_word_embeddings = true, but Llama 3.1 (and this model) "
                        "keeps separate embedding and output weights")
    kind = rope.get("rope_type", rope.get("type"))
    rs = rope if kind not in (None, "default") else None
    if m.rope_scaling:
        if kind != "llama3":
            problems.append(f"{where}: rope_scaling = {rs!r}, but the config applies Llama 3.1 "
                            "RoPE scaling (model.rope_scaling = true): expected rope_type 'llama3'")
        else:
            for hf_key, field in (("factor", "rope_scaling_factor"),
                                  ("low_freq_factor", "rope_low_freq_factor"),
                                  ("high_freq_factor", "rope_high_freq_factor"),
                                  ("original_max_position_embeddings",
                                   "rope_original_max_positions")):
                ours = getattr(m, field)
                if hf_key in rope and float(rope[hf_key]) != float(ours):
                    problems.append(f"{where}: rope_scaling.{hf_key} = {rope[hf_key]!r} but the "
                                    f"config has model.{field} = {ours!r}")
    elif rs:
        problems.append(f"{where}: rope_scaling = {rs!r}, but the config has "
                        "model.rope_scaling = false")
    return problems


def check(tensors: dict, hf_config: dict, m: ModelConfig, where: str) -> None:
    """Raise ConversionError listing every mismatch between a checkpoint and a model config.

    `tensors` maps name -> object with .dtype (safetensors string) and .shape. Checked: the vocab
    (checkpoint rows must equal model.vocab_size; a smaller tokenizer is fine, a smaller or larger
    embedding is not), every tensor's shape (naming the tensor and both shapes), missing and
    unexpected tensors, and dtypes.
    """
    problems: list[str] = []
    expected = expected_hf_shapes(m)
    emb = tensors.get("model.embed_tokens.weight")
    if emb is not None and len(emb.shape) == 2 and emb.shape[0] != m.vocab_size:
        problems.append(
            f"vocab: the checkpoint's embedding has {emb.shape[0]} rows but the config has "
            f"model.vocab_size = {m.vocab_size}; the model vocab must equal the checkpoint's "
            "(the tokenizer's may be smaller), so set model.vocab_size = "
            f"{emb.shape[0]} or use the matching checkpoint")
    shapes, dtypes = [], []
    for name, shape in expected.items():
        t = tensors.get(name)
        if t is None:
            continue
        if tuple(t.shape) != shape:
            shapes.append(f"shape: {name} is {tuple(t.shape)} in the checkpoint but the config "
                          f"needs {shape}")
        if t.dtype not in SOURCE_DTYPES:
            dtypes.append(f"dtype: {name} is {t.dtype}; expected one of "
                          f"{', '.join(SOURCE_DTYPES)} (quantized checkpoints are not inputs)")
    for kind, found in (("shape", shapes), ("dtype", dtypes)):
        problems += found[:MAX_LISTED]
        if len(found) > MAX_LISTED:
            problems.append(f"{kind}: ... and {len(found) - MAX_LISTED} more tensors like these")
    missing = [n for n in expected if n not in tensors]
    unexpected = [n for n in tensors if n not in expected and not n.endswith(IGNORED_SUFFIXES)]
    for label, names in (("missing", missing), ("unexpected", unexpected)):
        if names:
            more = f" (+{len(names) - 8} more)" if len(names) > 8 else ""
            problems.append(f"{label} tensors ({len(names)}): {', '.join(names[:8])}{more}")
    problems += _config_problems(hf_config, m, f"{where}/config.json")
    if problems:
        raise ConversionError(f"{where} does not match the model config:\n  - "
                              + "\n  - ".join(problems))


def qkv_rows(m: ModelConfig) -> list[tuple[int, int, int, int]]:
    """Row copies (source index 0/1/2 = q/k/v, src_start, dst_start, rows) of the fused QKV."""
    d, ng = m.kv_channels, m.num_query_groups
    per = m.num_attention_heads // ng
    stride = (per + 2) * d
    copies = []
    for g in range(ng):
        base = g * stride
        copies += [(0, g * per * d, base, per * d), (1, g * d, base + per * d, d),
                   (2, g * d, base + (per + 1) * d, d)]
    return copies


def fill(target: Target, m: ModelConfig, read, dtype):
    """Build the Megatron tensor of `target` reading its sources one at a time via read(name).

    Peak memory: the output buffer plus one source tensor (the source is freed before the next
    is read), i.e. 1.5x the fused tensor for QKV and fc1, 2x a plain tensor when the dtype
    changes, 1x when it does not.
    """
    import torch
    if len(target.sources) == 1:
        src = read(target.sources[0])
        return src if src.dtype == dtype else src.to(dtype)
    out = torch.empty(target.shape, dtype=dtype)
    if target.key == QKV:
        for idx, name in enumerate(target.sources):
            src = read(name)
            for which, s0, d0, rows in qkv_rows(m):
                if which == idx:
                    out[d0:d0 + rows].copy_(src[s0:s0 + rows])
            del src
    elif target.key == FC1:
        f = m.ffn_hidden_size
        for idx, name in enumerate(target.sources):
            src = read(name)
            out[idx * f:(idx + 1) * f].copy_(src)
            del src
    else:
        raise ConversionError(f"no fusion rule for {target.label}")
    return out
