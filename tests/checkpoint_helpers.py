"""Shared pieces of the checkpoint tests: a small random Hugging Face Llama 3.1 and its config."""
from __future__ import annotations

from pathlib import Path

SMALL = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, head_dim=8, vocab_size=320, rope_theta=500000.0,
             rms_norm_eps=1e-5, original_max_position_embeddings=8192)


def make_hf_llama(directory: Path, *, seed: int = 0, **overrides) -> Path:
    """Build a random transformers LlamaForCausalLM with GQA and Llama 3.1 RoPE scaling and save
    it as sharded safetensors (FP32) in `directory`."""
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
        mlp_bias=False, initializer_range=0.1, torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(conf)
    with torch.no_grad():   # HF initialises norms to 1: randomise them so a swap would show
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    # several shards + model.safetensors.index.json, like Meta's release
    model.save_pretrained(directory, safe_serialization=True, max_shard_size="300KB")
    return Path(directory)


def write_config(path: Path, *, hidden_size: int = SMALL["hidden_size"], tp: int = 1, pp: int = 1,
                 vp: int = 1, vocab_size: int = SMALL["vocab_size"]) -> Path:
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
kv_channels = {hidden_size // heads}
vocab_size = {vocab_size}
seq_length = 32
rope_original_max_positions = {SMALL['original_max_position_embeddings']}
[parallel]
tp = {tp}
pp = {pp}
vp = {vp}
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


def verify_rank(rank: int, world: int, port: int, config: str, hf: str, megatron: str,
                result: str) -> None:
    """One rank of a gloo job: load the Megatron checkpoint at the config's layout, compare with
    the Hugging Face logits; rank 0 writes the VerifyResult as JSON to `result`."""
    import dataclasses
    import json
    import socket

    from llama31_405b.checkpoint.verify import verify
    from llama31_405b.config.load import load_config
    from llama31_405b.parallel.distributed import DistEnv
    from llama31_405b.parallel.setup import setup_parallel, teardown_parallel
    cfg = load_config(config)
    de = DistEnv(rank=rank, world_size=world, local_rank=rank, master_addr="127.0.0.1",
                 master_port=port, hostname=socket.gethostname(), launcher="torchrun")
    setup_parallel(cfg, de, timeout_s=120)
    try:
        r = verify(cfg, hf, megatron, sequences=4, seq_len=16)
    finally:
        teardown_parallel()
    if rank == 0:
        Path(result).write_text(json.dumps(dataclasses.asdict(r)))


def empty_dcp_index() -> bytes:
    """A torch DCP `.metadata` naming no data file: the index of a stand-in checkpoint whose
    tensors nothing reads (checkpoint.data_files reads the index)."""
    import pickle

    from torch.distributed.checkpoint.metadata import Metadata
    return pickle.dumps(Metadata(state_dict_metadata={}, storage_data={}))
