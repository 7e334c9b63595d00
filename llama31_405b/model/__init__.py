"""Megatron-core Llama 3.1: config mapping, model chunks, RoPE frequencies."""
