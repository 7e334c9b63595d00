"""2-process gloo worker for the NVFP4 tests (one megatron import for all of them).

usage: python tests/nvfp4_dist_worker.py TMPDIR     (spawns 2 ranks; exit code 0 on success)
(tests/test_nvfp4_linear.py forks the two ranks of main(rank, TMPDIR) from tests/helpers/zygote.py)

Part 1 shards the weight by hand (plain torch.distributed); part 2 runs megatron-core's
ColumnParallelLinear -> RowParallelLinear (an MLP) with the emulation hook; both compare TP=2
against the TP=1 NVFP4 linear on the full tensors, computed on every rank. Part 3 applies
apply_nvfp4_emulation to a real megatron GPTModel (local spec, TP=2, Megatron DDP) and checks
which layers switched, the state dict, one layer's exact output and the loss gap to FP32.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from llama31_405b.config import load_config

from llama31_405b.precision.linear import AmaxGroups, NVFP4Recipe, nvfp4_linear, tp_amax_groups
from llama31_405b.precision.nvfp4 import fake_quantize

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


T, K, N = 64, 64, 96
RECIPES = (NVFP4Recipe(rht=True, weights_2d=True), NVFP4Recipe(rht=True))


def _full(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g)
    w1 = torch.randn(N, K, generator=g) * 0.1
    w1[N // 2:] *= 0.3                           # shards with different amax
    w2 = torch.randn(K, N, generator=g) * 0.1
    w2[:, N // 2:] *= 3.0
    dy = torch.randn(T, N, generator=g) * 1e-2
    return x, w1, w2, dy


def _lin(x, w, dy, recipe, groups=AmaxGroups()):
    x, w = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = nvfp4_linear(x, w, recipe=recipe, amax_groups=groups)
    y.backward(dy)
    return y.detach(), x.grad, w.grad


def _close(a, b, what):
    err = ((a - b).norm() / b.norm()).item()
    assert err < 1e-5, f"{what}: relative difference {err:.2e}"


def part1_plain(rank, group):
    x, w1, w2, dy = _full()
    h = N // 2
    cols = slice(rank * h, (rank + 1) * h)
    for recipe in RECIPES:
        # column-parallel: W [N, K] split over N; X replicated; dY split over N; dX all-reduced
        ref = _lin(x, w1, dy, recipe)
        g = tp_amax_groups("column", group, scope="tensor")
        assert g == AmaxGroups(w=group, dy=group)
        y, dx, dw = _lin(x, w1[cols], dy[:, cols], recipe, g)
        dist.all_reduce(dx, group=group)
        assert torch.equal(y, ref[0][:, cols]), "column fprop"
        _close(dx, ref[1], "column dgrad")
        assert torch.equal(dw, ref[2][cols]), "column wgrad"
        # TE's scope keeps the weight shard's own amax: the operands differ from TP1
        te = _lin(x, w1[cols], dy[:, cols], recipe, tp_amax_groups("column", group))
        assert tp_amax_groups("column", group) == AmaxGroups()
        assert not torch.equal(te[0], ref[0][:, cols]) or rank == 0

        # row-parallel: W [K_out=K, N_in] split over N_in, X split the same way, Y all-reduced
        xr = x.repeat(1, 2)[:, :N] * 0.5 + dy * 10     # an input with N_in = 96 features
        ref = _lin(xr, w2, x, recipe)
        g = tp_amax_groups("row", group, scope="tensor")
        assert g == AmaxGroups(x=group, w=group)
        y, dx, dw = _lin(xr[:, cols], w2[:, cols], x, recipe, g)
        dist.all_reduce(y, group=group)
        _close(y, ref[0], "row fprop")
        assert torch.equal(dx, ref[1][:, cols]), "row dgrad"
        assert torch.equal(dw, ref[2][:, cols]), "row wgrad"

    # sequence parallel, quantized as shards the way TE does (amax reduced over the TP group)
    rows = slice(rank * T // 2, (rank + 1) * T // 2)
    g = tp_amax_groups("column", group, sequence_parallel=True, gathered=False)
    assert g == AmaxGroups(x=group)
    assert torch.equal(fake_quantize(x[rows], amax_group=g.x), fake_quantize(x)[rows])
    assert torch.equal(fake_quantize(x[rows], columnwise=True, rht=True, amax_group=g.x),
                       fake_quantize(x, columnwise=True, rht=True)[:, rows])
    g = tp_amax_groups("row", group, sequence_parallel=True, gathered=False)
    assert g == AmaxGroups(dy=group)
    assert torch.equal(fake_quantize(dy[rows], amax_group=g.dy), fake_quantize(dy)[rows])
    assert tp_amax_groups("row", group, sequence_parallel=True) == AmaxGroups()


def part2_megatron(rank, group, scope):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.transformer_config import TransformerConfig

    from llama31_405b.precision.emulation import emulate_linear

    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=2)
    cfg = TransformerConfig(num_layers=1, hidden_size=K, num_attention_heads=4,
                            use_cpu_initialization=True, tensor_model_parallel_size=2,
                            add_bias_linear=False)
    x, w1, w2, dy = _full(1)
    h = N // 2
    cols = slice(rank * h, (rank + 1) * h)
    recipe = RECIPES[0]
    fc1 = ColumnParallelLinear(K, N, config=cfg, init_method=torch.nn.init.zeros_, bias=False,
                               gather_output=False)
    fc2 = RowParallelLinear(N, K, config=cfg, init_method=torch.nn.init.zeros_, bias=False,
                            input_is_parallel=True, skip_bias_add=True)
    with torch.no_grad():
        fc1.weight.copy_(w1[cols])
        fc2.weight.copy_(w2[:, cols])
    keys = set(fc1.state_dict()) | set(fc2.state_dict())
    emulate_linear(fc1, recipe, scope=scope)
    emulate_linear(fc2, recipe, scope=scope)
    assert set(fc1.state_dict()) | set(fc2.state_dict()) == keys
    xi = x[:, None, :].clone().requires_grad_(True)           # [s, b, h]
    hmid, _ = fc1(xi)
    out, _ = fc2(hmid)
    out.backward(dy[:, None, :K])
    # TP1 reference: the same two NVFP4 linears on the full weights
    x1 = x.clone().requires_grad_(True)
    W1, W2 = w1.clone().requires_grad_(True), w2.clone().requires_grad_(True)
    ref = nvfp4_linear(nvfp4_linear(x1, W1, recipe=recipe), W2, recipe=recipe)
    ref.backward(dy[:, :K])
    _close(out[:, 0].detach(), ref.detach(), f"megatron MLP fprop ({scope})")
    if scope == "tensor":
        _close(xi.grad[:, 0], x1.grad, "megatron MLP dgrad")
        _close(fc1.weight.grad, W1.grad[cols], "megatron fc1 wgrad")
        _close(fc2.weight.grad, W2.grad[:, cols], "megatron fc2 wgrad")


def part3_gpt(rank, group):
    import megatron.core.tensor_parallel.random as mrandom
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from llama31_405b.precision.emulation import apply_nvfp4_emulation
    from llama31_405b.precision.te_recipe import transformer_config_kwargs

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda s, *a, **k: torch.set_rng_state(s)
    torch.manual_seed(0)
    mrandom.model_parallel_cuda_manual_seed(123)

    over = {"precision": {"compute": "nvfp4", "bf16_layers_at_start": 1, "bf16_layers_at_end": 1,
                          "nvfp4_rht": True, "nvfp4_stochastic_rounding": True,
                          "nvfp4_2d_weights": True}}
    cfg = load_config("configs/tiny_cpu.toml", overrides=over)
    m = cfg.model
    kw = transformer_config_kwargs(cfg)
    kw.pop("fp4")        # TE is not installed here: build the config without the FP4 switch
    tc = TransformerConfig(num_layers=m.num_layers, hidden_size=m.hidden_size,
                           ffn_hidden_size=m.ffn_hidden_size, num_attention_heads=m.num_attention_heads,
                           num_query_groups=m.num_query_groups, kv_channels=m.kv_channels,
                           gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm",
                           add_bias_linear=False, use_cpu_initialization=True, hidden_dropout=0.0,
                           attention_dropout=0.0, tensor_model_parallel_size=2, **kw)
    assert tc.first_last_layers_bf16 and tc.num_layers_at_start_in_bf16 == 1

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
    return loss.item(), ref.item()


def main(rank, tmp):
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=2)
    torch.set_num_threads(1)
    group = dist.group.WORLD
    with _CpuDevice():
        part1_plain(rank, group)
        part2_megatron(rank, group, "tensor")
        try:
            part2_megatron(rank, group, "te")
            te_equal = True
        except AssertionError:
            te_equal = False
        if rank == 0:
            print(f"TP2 == TP1: ok (TE amax scope equal to TP1 as well: {te_equal})", flush=True)
        loss, ref = part3_gpt(rank, group)
        if rank == 0:
            print(f"emulation: ok (TP2 GPTModel loss nvfp4 {loss:.7f} fp32 {ref:.7f})", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(sys.argv[1],), nprocs=2, join=True)
