"""Single-process worker for tests/test_nvfp4_emulation.py: apply_nvfp4_emulation on a real
megatron-core GPTModel (local spec, CPU, gloo), wrapped in Megatron's DDP.

usage: python tests/nvfp4_gpt_worker.py TMPDIR      (exit code 0 and "emulation: ok" on success)
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from llama31_405b.config import load_config
from llama31_405b.precision.linear import NVFP4Recipe, nvfp4_linear

# --- the minimum CPU patches this test needs (the project's cpu_compat does it for real runs) ---
torch.cuda.current_device = lambda: "cpu"
torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()


class _Stream:
    def wait_event(self, *a, **k): pass
    def wait_stream(self, *a, **k): pass
    def synchronize(self): pass


torch.cuda.current_stream = lambda *a, **k: _Stream()


class _CpuDevice(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def main(tmp: str) -> None:
    import megatron.core.tensor_parallel.random as mrandom
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda s, *a, **k: torch.set_rng_state(s)
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from llama31_405b.precision.emulation import apply_nvfp4_emulation

    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    ps.initialize_model_parallel()
    torch.manual_seed(0)
    mrandom.get_cuda_rng_tracker().add("model-parallel-rng", 1)

    over = {"precision": {"compute": "nvfp4", "bf16_layers_at_start": 1, "bf16_layers_at_end": 1,
                          "nvfp4_rht": True, "nvfp4_stochastic_rounding": True,
                          "nvfp4_2d_weights": True}}
    cfg = load_config("configs/tiny_cpu.toml", overrides=over)
    m = cfg.model
    tc = TransformerConfig(num_layers=m.num_layers, hidden_size=m.hidden_size,
                           ffn_hidden_size=m.ffn_hidden_size, num_attention_heads=m.num_attention_heads,
                           num_query_groups=m.num_query_groups, kv_channels=m.kv_channels,
                           gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm",
                           add_bias_linear=False, use_cpu_initialization=True, hidden_dropout=0.0,
                           attention_dropout=0.0)
    def build():
        return GPTModel(tc, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                        vocab_size=256, max_sequence_length=64, position_embedding_type="rope",
                        share_embeddings_and_output_weights=False)

    model, plain = build(), build()
    plain.load_state_dict(model.state_dict())
    ddp = DistributedDataParallel(tc, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    keys = list(ddp.state_dict())

    assert apply_nvfp4_emulation([ddp], load_config("configs/tiny_cpu.toml")) == 0   # fp32 config
    n = apply_nvfp4_emulation([ddp], cfg)
    assert n == 8, f"expected 8 NVFP4 linears (layers 2 and 3), got {n}"
    assert apply_nvfp4_emulation(ddp, cfg) == 8                                     # idempotent
    assert list(ddp.state_dict()) == keys
    for layer in model.decoder.layers:
        lins = [layer.self_attention.linear_qkv, layer.self_attention.linear_proj,
                layer.mlp.linear_fc1, layer.mlp.linear_fc2]
        quantized = [getattr(lin, "nvfp4_recipe", None) is not None for lin in lins]
        want = layer.layer_number in (2, 3)
        assert quantized == [want] * 4, (layer.layer_number, quantized)
    assert getattr(model.output_layer, "nvfp4_recipe", None) is None

    # one linear computes exactly the NVFP4 linear of its input
    seen = {}
    fc1 = model.decoder.layers[1].mlp.linear_fc1
    fc1.register_forward_hook(lambda mod, inp, out: seen.update(x=inp[0].detach(), y=out[0].detach()))

    g = torch.Generator().manual_seed(3)
    b, s = 2, 64
    ids = torch.randint(0, 256, (b, s), generator=g)
    batch = dict(input_ids=ids, position_ids=torch.arange(s).expand(b, s),
                 attention_mask=torch.triu(torch.ones(s, s, dtype=torch.bool), 1)[None, None],
                 labels=torch.roll(ids, -1, 1))
    loss = ddp(**batch).float().mean()
    loss.backward()
    ddp.finish_grad_sync()
    recipe = NVFP4Recipe(rht=True, stochastic_rounding=True, weights_2d=True)
    assert torch.equal(seen["y"], nvfp4_linear(seen["x"], fc1.weight.detach(), recipe=recipe))
    g_fc1 = fc1.weight.main_grad
    assert torch.isfinite(g_fc1).all() and g_fc1.abs().sum() > 0

    ref = plain(**batch).float().mean()
    rel = abs(loss.item() - ref.item()) / ref.item()
    assert 0 < rel < 0.02, f"NVFP4 vs FP32 loss relative gap {rel:.3g}"
    print(f"emulation: ok (loss nvfp4 {loss.item():.5f} fp32 {ref.item():.5f})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with _CpuDevice():
        main(sys.argv[1])
