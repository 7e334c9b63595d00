"""Llama 3.1 RoPE frequencies, computed from the config.

Megatron-core's RotaryEmbedding applies the Llama 3 scaling with low_freq_factor 1,
high_freq_factor 4 and original context 8192 hardcoded and only the factor configurable; the
project computes the inverse frequencies from every field of cfg.model and installs them in the
model (model.builder), so a config that changes any of them is honoured exactly.

Llama 3.1 scaling, per rotary frequency f (wavelength w = 2 pi / f), with factor s, low/high
frequency factors l/h and original context C:
  w < C/h (high frequency):  f unchanged
  w > C/l (low frequency):   f / s
  otherwise:                 (1 - a) f / s + a f,  a = (C/w - l) / (h - l)
"""
from __future__ import annotations

import math

import torch

from ..config.schema import ModelConfig


def base_inv_freq(kv_channels: int, base: float) -> torch.Tensor:
    """1 / base^(2i/d) for i in [0, d/2), FP32 (as Megatron computes it). Always computed on the
    CPU, also under a `torch.device("meta")` context (the checkpoint converter builds the model
    there), and moved to the model's device by the builder."""
    i = torch.arange(0, kv_channels, 2, dtype=torch.float32, device="cpu")
    return 1.0 / (base ** (i / kv_channels))


def llama31_scale(inv_freq: torch.Tensor, *, factor: float, low_freq_factor: float,
                  high_freq_factor: float, original_max_positions: int) -> torch.Tensor:
    """Apply the Llama 3.1 frequency scaling to RoPE inverse frequencies."""
    if high_freq_factor <= low_freq_factor:
        raise ValueError(f"rope: high_freq_factor ({high_freq_factor}) must exceed "
                         f"low_freq_factor ({low_freq_factor})")
    ctx = float(original_max_positions)
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = ctx / low_freq_factor      # longer than this: fully interpolated
    high_wavelen = ctx / high_freq_factor    # shorter than this: untouched
    alpha = (ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - alpha) * inv_freq / factor + alpha * inv_freq
    out = torch.where(wavelen > low_wavelen, inv_freq / factor, blended)
    return torch.where(wavelen < high_wavelen, inv_freq, out)


def llama31_inv_freq(model: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies of a ModelConfig (with scaling when model.rope_scaling)."""
    inv = base_inv_freq(model.kv_channels, model.rope_base)
    if not model.rope_scaling:
        return inv
    return llama31_scale(inv, factor=model.rope_scaling_factor,
                         low_freq_factor=model.rope_low_freq_factor,
                         high_freq_factor=model.rope_high_freq_factor,
                         original_max_positions=model.rope_original_max_positions)
