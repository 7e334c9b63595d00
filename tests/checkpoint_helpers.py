"""Shared pieces of the checkpoint tests: a small random Hugging Face Llama 3.1 and its config."""
from __future__ import annotations

from pathlib import Path

SMALL = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, head_dim=8, vocab_size=320, rope_theta=500000.0,
             rms_norm_eps=1e-5, original_max_position_embeddings=8192)


def make_hf_llama(directory: Path, *, seed: int = 0, **overrides) -> Path:
    """Build a random transformers LlamaForCausalLM with GQA and Llama 3.1 RoPE scaling and save
    it as safetensors (FP32) in `directory`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    p = {**SMALL, **overrides}
    conf = LlamaConfig(
        hidden_size=p["hidden_size"], intermediate_size=p["intermediate_size"],
        num_hidden_layers=p["num_hidden_layers"], num_attention_heads=p["num_attention_heads"],
        num_key_value_heads=p["num_key_value_heads"], head_dim=p["head_dim"],
        vocab_size=p["vocab_size"], rms_norm_eps=p["rms_norm_eps"], rope_theta=p["rope_theta"],
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0,
                      "original_max_position_embeddings": p["original_max_position_embeddings"]},
        max_position_embeddings=131072, tie_word_embeddings=False, attention_bias=False,
        mlp_bias=False, torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(conf)
    with torch.no_grad():   # HF initialises norms to 1: randomise them so a swap would show
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(directory, safe_serialization=True)
    return Path(directory)


def write_config(path: Path, *, hidden_size: int = SMALL["hidden_size"], tp: int = 1, pp: int = 1,
                 vocab_size: int = SMALL["vocab_size"]) -> Path:
    """A TOML over configs/tiny_cpu.toml with the small model's shape (open division)."""
    root = Path(__file__).resolve().parents[1]
    heads = SMALL["num_attention_heads"]
    path.write_text(f"""base = "{root / 'configs' / 'tiny_cpu.toml'}"
[model]
num_layers = {SMALL['num_hidden_layers']}
hidden_size = {hidden_size}
ffn_hidden_size = {SMALL['intermediate_size']}
num_attention_heads = {heads}
num_query_groups = {SMALL['num_key_value_heads']}
kv_channels = {SMALL['head_dim']}
vocab_size = {vocab_size}
seq_length = 32
rope_original_max_positions = {SMALL['original_max_position_embeddings']}
[parallel]
tp = {tp}
pp = {pp}
[system]
id = "cpu"
racks = 1
gpus_per_rack = {tp * pp}
[batch]
minibs = 2
micro_batch_size = 1
[run]
division = "open"
""")
    return path
