"""One TP4 shard of a Llama 3.1 405B decoder layer, forward + backward on one GPU, per part,
next to the planner's prediction for that GPU.

    PYTHONPATH=. python bench/gpu_layer.py [--system h200-sxm] [--config configs/...toml]

What runs: the layer a GPU of the published layout (TP4, CP2, MBS 1) computes: hidden 16384, FFN
53248/4 = 13312 per rank, 128/4 = 32 query heads, 8/4 = 2 KV heads, head dim 128, sequence
8192/CP2 = 4096 tokens, BF16, Megatron's local (no Transformer Engine) layer spec.

How it is built, and why that way: through the project's model builder
(`llama31_405b.model.builder.transformer_config(cfg)` and `layer_spec(cfg, te=False)`), from the 128-rack
config in configs/ with `model` overridden to the shard's shapes (32 heads, 2 query groups,
FFN 13312, one layer, sequence 4096) and `parallel` to TP = PP = CP = 1. A TP4 layer proper cannot
be built on one rank: Megatron's parallel linear layers divide by the size of an initialised TP
process group and its sequence-parallel collectives need four ranks. A TP = 1 layer with the shard's
head counts and FFN width has exactly the shard's GEMMs ([4096 x 16384] x [16384 x 4608] QKV,
[4096 x 4096] x [4096 x 16384] projection, [4096 x 16384] x [16384 x 26624] FC1,
[4096 x 13312] x [13312 x 16384] FC2) and its attention heads; what it leaves out is the TP/CP
communication, which the planner models separately. The config is loaded unvalidated because
32 heads x 128 != hidden 16384 is not a Llama 3.1 model on its own (the validator says so).

Parts are timed by calling the built layer's own submodules (linear_qkv, core_attention,
linear_proj, linear_fc1, linear_fc2) on inputs of their shapes, forward + backward, with CUDA
events (median of --iters after --warmup); the whole layer is timed the same way. Achieved
TFLOP/s counts 6*M*N*K per GEMM; for attention it counts what the local (unfused) path executes:
the full 4096 x 4096 score matrix per head (causal masking does not skip work there), while the
planner's attention figure is for a fused causal kernel (TE/cuDNN), so that row compares
different kernels and says so. RoPE is not applied (no rotary embedding is passed); it is
elementwise and part of the planner's elementwise term.

Then the shard's four linear GEMMs alone, in BF16 and in FP8 (`torch._scaled_mm`, E4M3,
per-tensor scales; the training precision of the HGX H200 configs), forward + data + weight
gradient, beside the dense peak and the planner's rate for that precision
(llama31_405b.first_contact.gemm, the code first-contact's `gemms_tp4` check runs).

first-contact's layer phase (llama31_405b/first_contact/layer.py, run on the H200 by
scripts/h200_first_contact.py) measures the whole layer's forward and backward in this shard's
shape and unsharded, with the GPU's matrix ceilings and MFU; this bench adds the per-part table.

Needs CUDA, torch and megatron-core (on the lent H200: carry the megatron-core wheel). Writes
the table as JSON to $OUT/gpu_layer.json when OUT is set, or to --json-out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, cast

if TYPE_CHECKING:   # imported in main, after the CUDA check
    import torch
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.transformer_layer import TransformerLayer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

Part: TypeAlias = "Callable[..., torch.Tensor | tuple[torch.Tensor, object]]"
"""A part of the layer, called on its inputs: its output (a module's call)."""

SEQ = 4096  # 8192 / CP2
HEADS, GROUPS, FFN, KV = 32, 2, 13312, 128  # per TP4 rank


def shard_overrides(system: str) -> dict:
    """The shard's shapes over the config (shared with first-contact's layer phase, P4)."""
    from llama31_405b.first_contact.layer import layer_overrides
    return layer_overrides("tp4_shard", system, SEQ)


def planner_rates(system: str, precision: str = "bf16") -> tuple[dict[str, float], float]:
    """Predicted TFLOP/s per part and seconds of one layer (fwd + bwd) for the shard on `system`
    in `precision`."""
    from llama31_405b.planner import compute
    from llama31_405b.planner.calibrate import fitted
    from llama31_405b.planner.context import Context, Stage
    from llama31_405b.planner.spec import make_config
    cfg = make_config(system, 1, tp=4, pp=1, vp=1, cp=2, minibs=1, precision=precision)
    ctx = Context.of(cfg)
    fit = fitted()
    layer = compute.stage_parts(ctx, Stage("one layer", 1, False, False), fit)
    return compute.part_rates(ctx, fit), layer.total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="h200-sxm", help="planner system file of this GPU")
    ap.add_argument("--config", default=str(REPO / "configs" / "config_GB200_2048x4x8xtp4pp8cp2.toml"))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print("error: bench/gpu_layer.py needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2
    try:
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
        from megatron.core.transformer.enums import AttnMaskType
        from megatron.core.transformer.spec_utils import build_module
        from megatron.core.typed_torch import apply_module
    except ImportError as e:
        print(f"error: megatron-core is not importable ({e}); install or carry its wheel", file=sys.stderr)
        return 2
    try:
        from llama31_405b.model.builder import layer_spec, transformer_config
    except ImportError as e:
        print(f"error: the project's model builder is missing ({e}): bench/gpu_layer.py builds the "
              "layer through llama31_405b.model.builder.transformer_config/layer_spec", file=sys.stderr)
        return 2
    from llama31_405b.config.load import load_config

    predicted, predicted_layer_s = planner_rates(args.system)
    cfg = load_config(args.config, validate=False, overrides=shard_overrides(args.system))

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    model_parallel_cuda_manual_seed(1234)

    tc = transformer_config(cfg)
    tc.gradient_accumulation_fusion = False  # no DDP wrapper here, so no weight.main_grad buffers
    # the local spec on purpose (te=False): what this bench measures and what runs without TE
    # megatron-core 0.19.2 leaves build_module's return unannotated and types the layer's MLP as
    # its interface: the local spec's classes are named here, so their attributes are checked,
    # and each submodule is called through megatron-core's `typed_torch.apply_module` (the
    # module itself, typed by its interface's forward), so the arguments are checked too
    layer: TransformerLayer = build_module(layer_spec(cfg, te=False), config=tc,
                                           layer_number=1).to(device="cuda", dtype=torch.bfloat16)
    sa: SelfAttention = layer.self_attention
    mlp = cast("MLP", layer.mlp)
    h = cfg.model.hidden_size
    dev, bf = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape: int, grad: bool = True) -> torch.Tensor:
        return (torch.randn(*shape, device=dev, dtype=bf, generator=gen) * 0.02).requires_grad_(grad)

    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool, device=dev), 1)[None, None]

    def timed(fn: Part, inputs: list[torch.Tensor]) -> float:
        """Median seconds of forward + backward of fn(*inputs)."""
        times = []
        for i in range(args.warmup + args.iters):
            for t in inputs:
                t.grad = None
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*inputs)
            out = out[0] if isinstance(out, tuple) else out
            out.backward(torch.ones_like(out))
            end.record()
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    x = rnd(SEQ, 1, h)
    qkv_out = (HEADS + 2 * GROUPS) * KV
    parts: dict[str, tuple[Part, list[torch.Tensor], float]] = {
        "qkv": (lambda t: apply_module(sa.linear_qkv)(t), [x], 6.0 * SEQ * qkv_out * h),
        # attention_bias and packed_seq_params: None, DotProductAttention.forward's defaults
        "attention": (lambda q, k, v: apply_module(sa.core_attention)(
                          q, k, v, mask, attn_mask_type=AttnMaskType.causal, attention_bias=None,
                          packed_seq_params=None),
                      [rnd(SEQ, 1, HEADS, KV), rnd(SEQ, 1, GROUPS, KV), rnd(SEQ, 1, GROUPS, KV)],
                      3 * 4.0 * SEQ * SEQ * HEADS * KV),
        "proj": (lambda t: apply_module(sa.linear_proj)(t), [rnd(SEQ, 1, HEADS * KV)],
                 6.0 * SEQ * h * HEADS * KV),
        "ffn_up": (lambda t: apply_module(mlp.linear_fc1)(t), [x], 6.0 * SEQ * 2 * FFN * h),
        "ffn_down": (lambda t: apply_module(mlp.linear_fc2)(t), [rnd(SEQ, 1, FFN)],
                     6.0 * SEQ * h * FFN),
    }
    rows = []
    print(f"TP4 shard of a 405B layer on {torch.cuda.get_device_name()} (BF16, local spec), "
          f"median of {args.iters} fwd+bwd; planner system {args.system}", flush=True)
    for name, (fn, inputs, flops) in parts.items():
        s = timed(fn, inputs)
        rows.append(dict(part=name, ms=s * 1e3, achieved_tflops=flops / s / 1e12,
                         predicted_tflops=predicted[name], ratio=flops / s / 1e12 / predicted[name]))
        print(f"  {name:<10} {s * 1e3:8.3f} ms  achieved {flops / s / 1e12:7.1f} TFLOP/s   "
              f"planner {predicted[name]:7.1f} TFLOP/s   achieved/planner {rows[-1]['ratio']:.2f}"
              + ("   (unfused local attention vs the planner's fused causal kernel)"
                 if name == "attention" else ""),
              flush=True)
    from llama31_405b.first_contact import gemm
    for prec in gemm.PRECISIONS:
        assumed = gemm.planner_assumption(args.system, prec)
        by = gemm.shard_gemms({k: v["mnk"] for k, v in assumed["linears"].items()},
                              precisions=(prec,), iters=args.iters, warmup=args.warmup)
        for name, r in ((k, v[prec]) for k, v in by.items()):
            r.update(gemm.against_planner(r, assumed, name))
            rows.append(dict(part=f"gemm_{name}_{prec}", mnk=r["mnk"], ms=r["seconds"] * 1e3,
                             achieved_tflops=r["tflops"], predicted_tflops=r["planner_tflops"],
                             ratio=r["tflops"] / r["planner_tflops"],
                             share_of_peak=r["share_of_peak"]))
            print(f"  {name + ' ' + prec:<10} {r['seconds'] * 1e3:8.3f} ms  achieved "
                  f"{r['tflops']:7.1f} TFLOP/s   planner {r['planner_tflops']:7.1f} TFLOP/s   "
                  f"achieved/planner {rows[-1]['ratio']:.2f}   {r['share_of_peak']:.0%} of the "
                  f"{assumed['peak_tflops']:.0f} dense peak (GEMMs alone)", flush=True)
    s = timed(lambda t: layer(hidden_states=t, attention_mask=mask), [x])
    rows.append(dict(part="layer", ms=s * 1e3, predicted_ms=predicted_layer_s * 1e3,
                     ratio=predicted_layer_s / s))
    print(f"  {'layer':<10} {s * 1e3:8.3f} ms  planner {predicted_layer_s * 1e3:8.3f} ms "
          f"(compute only, fused attention)   planner/achieved {predicted_layer_s / s:.2f}")
    out = args.json_out
    if out is None and os.environ.get("OUT"):
        out = os.path.join(os.environ["OUT"], "gpu_layer.json")
    if out:
        Path(out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "system": args.system,
                                         "rows": rows}, indent=2))
        print(f"wrote {out}")
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
