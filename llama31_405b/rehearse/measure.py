"""Bytes a rank holds, read from what Megatron built on the meta device (megatron-core 0.19.2):

- weights: DDP's contiguous parameter buffers (`_ParamAndGradBuffer.param_data`; the model's
  parameters are views into them, padding included);
- gradients: DDP's gradient buffers (`grad_data`, BF16 or FP32 by ddp_config.grad_reduce_in_fp32);
- master weights: the distributed optimizer's FP32 shards of the BF16 parameters
  (`shard_fp32_from_float16_groups`; FP32 parameters' shards are views, not counted);
- optimizer state: the tensors of the inner optimizer's state (Adam's exp_avg and exp_avg_sq),
  created by Megatron's `init_state_fn`.
Plus, computed (no TE here): the quantized copies Transformer Engine keeps of each transformer
linear weight for its GEMMs, rowwise and columnwise: NVFP4 (4-bit values and one E4M3 scale per
16: 0.5625 B per element) or FP8 (1 B); none of FP8 parameters, one of NVFP4 parameters (the
copies the planner counts, planner/memory.py).
"""
from __future__ import annotations

COPY_BYTES_PER_ELEMENT = {"nvfp4": 0.5625, "fp8": 1.0}
"""NVFP4: 4 bits per value + an 8-bit E4M3 scale per 16 values (docs/nvfp4.md); FP8: 1 byte."""
TE_LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def _nbytes(t) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _inner(opt) -> list:
    return list(getattr(opt, "chained_optimizers", [opt]))


def buffer_bytes(ddp_chunks) -> dict[str, int]:
    weights = grads = 0
    for chunk in ddp_chunks:
        for buf in list(chunk.buffers) + list(getattr(chunk, "expert_parallel_buffers", [])):
            weights += _nbytes(buf.param_data)
            grads += _nbytes(buf.grad_data)
    return {"weights": weights, "grads": grads}


def init_optimizer_state(opt) -> None:
    """Adam's state, as Megatron creates it before loading a checkpoint (the run's first step
    would create the same tensors)."""
    for o in _inner(opt):
        if getattr(o, "init_state_fn", None) is not None:
            o.init_state_fn(o.optimizer, o.config)


def optimizer_bytes(opt) -> dict[str, int]:
    import torch
    master = state = 0
    for o in _inner(opt):
        for group in getattr(o, "shard_fp32_from_float16_groups", []):
            master += sum(_nbytes(t) for t in group)
        for values in o.optimizer.state.values():
            state += sum(_nbytes(v) for v in values.values() if torch.is_tensor(v))
    return {"master_weights": master, "optimizer_state": state}


def _layer_modules(chunks):
    from ..model.builder import unwrap
    for chunk in chunks:
        decoder = getattr(unwrap(chunk), "decoder", None)
        yield chunk, list(decoder.layers) if decoder is not None else []


def layers_held(chunks) -> list[dict]:
    """Per model chunk: the global (1-based) transformer layer numbers it holds, and whether it
    has the embedding (first stage) or the output layer and loss (last stage)."""
    from ..model.builder import unwrap
    out = []
    for i, (chunk, layers) in enumerate(_layer_modules(chunks)):
        m = unwrap(chunk)
        numbers = [int(layer.layer_number) for layer in layers]
        out.append({"chunk": i, "layers": [min(numbers), max(numbers)] if numbers else [],
                    "count": len(numbers), "embedding": bool(m.pre_process),
                    "output": bool(m.post_process)})
    return out


def te_copy_bytes(chunks, cfg) -> int:
    """TE's quantized copies of the transformer linear weights (0 in BF16/FP32 compute; BF16 edge
    layers excluded)."""
    compute, perf = cfg.precision.compute, cfg.performance
    if compute not in COPY_BYTES_PER_ELEMENT:
        return 0
    if compute == "nvfp4":
        copies = 1 if perf.fp4_param_gather else 2
    else:
        copies = 0 if perf.fp8_param_gather else 2
    from ..precision.emulation import is_bf16_edge_layer
    total = 0
    for _, layers in _layer_modules(chunks):
        for layer in layers:
            if is_bf16_edge_layer(int(layer.layer_number), cfg):
                continue
            for name, p in layer.named_parameters():
                if name.endswith(".weight") and any(f".{n}." in f".{name}" for n in TE_LINEARS):
                    total += p.numel()
    return int(total * copies * COPY_BYTES_PER_ELEMENT[compute])


def param_count(chunks) -> int:
    return sum(p.numel() for c in chunks for p in c.parameters())
