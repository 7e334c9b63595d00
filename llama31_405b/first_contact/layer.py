"""P4: the speed of one 405B-width layer on the GPU in hand, against the GPU's own BF16
matrix-product ceiling measured in the same run and against the planner's compute model; the
matrix products in BF16 and FP8 (module gemm).

- `matmul_ceiling`, `matmul_ceiling_fp8`: an 8192 x 8192 x 8192 matrix product on random data,
  BF16 through torch (cuBLAS), FP8 (E4M3, per-tensor scales) through `torch._scaled_mm`, median
  of 50 after 5 warm-ups, timed with CUDA events (the BF16 one is the ceiling an MFU is read
  against here); each beside the system file's dense peak and the planner's assumption.
- `gemms_tp4`: the four linear GEMMs of the TP4 shard the HGX H200 configs train (TP4, CP2,
  MBS 1: 4,096 tokens), forward, data and weight gradient, in BF16 and FP8, each beside the
  dense peak and the planner's times for it (gemm.shard_gemms, gemm.against_planner).
- `bench_layer`: one decoder layer built by the project's builder with Megatron's local layer
  spec in BF16 (`model.builder.transformer_config` and `layer_spec(cfg, te=False)`, as
  bench/gpu_layer.py), forward and backward timed separately (CUDA events, median of --iters
  after warm-ups) at sequence 4096, MBS 1, in two shapes: "full" (TP 1: 128 query / 8 KV heads,
  FFN 53248) and "tp4_shard" (what one GPU of the published TP4 layout computes: 32 / 2 heads,
  FFN 13312; the TP communication left out). RoPE is not applied (no rotary embedding passed).
- Model FLOPs count the project's convention (config.derived.model_flops_per_sequence:
  non-causal attention, 6 x parameters x tokens for the GEMMs): MFU = model FLOPs / time /
  ceiling. The local attention executes the full S x S scores (causal masking skips no work).
- The planner's prediction for the same shapes: `planner.compute.chunk_parts` of a one-layer
  chunk on this system at TP 1 or TP 4, CP 1, sequence 4096, BF16 (forward, backward); its
  attention term is a fused causal kernel (TE/cuDNN), not the local one, and the report says
  so. Ratio = predicted / measured (1.0: the planner is right; < 1: optimistic).
- `nvfp4_emulation`: the project's NVFP4 emulation (precision.linear.nvfp4_linear, pure torch)
  on the GPU: its quantized operands equal the CPU path's bit for bit, a linear's forward and
  backward agree with the CPU's within FP32 summation order, and at a 405B-width GEMM (the TP4
  shard's FC1: 4096 tokens x 16384 -> 26624) its error against an FP32 product and its time
  against a BF16 linear. Hopper has no FP4 tensor cores: this is the emulation, not TE's NVFP4.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .gemm import CEILING_N

if TYPE_CHECKING:   # torch and megatron-core are imported where they are used
    import torch
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from ..config.schema import Config, ModelConfig
    from .gemm import Assumed, Ceiling, GemmRow
    from .layer_types import LayerRow, LayerTiming, Note, Nvfp4Figures, PlannerLayer, ShardGemms
    from .report import Report

SEQ = 4096
CEILINGS = {"matmul_ceiling": "bf16", "matmul_ceiling_fp8": "fp8"}
FP8_MAX_REL_ERROR = 0.1
"""Largest relative error of an FP8 product (per-tensor E4M3 scales) against BF16 on random
data accepted: E4M3's 3 mantissa bits give about 0.037 on normal random operands; a wrong scale
gives 1 or more."""
SHAPES = {"full": {"num_attention_heads": 128, "num_query_groups": 8, "ffn_hidden_size": 53248,
                   "tp": 1},
          "tp4_shard": {"num_attention_heads": 32, "num_query_groups": 2, "ffn_hidden_size": 13312,
                        "tp": 4}}


def matmul_ceiling(n: int = 8192, iters: int = 50, warmup: int = 5) -> Ceiling:
    """The BF16 n^3 product on the GPU (gemm.ceiling)."""
    from .gemm import ceiling
    return ceiling("bf16", n=n, iters=iters, warmup=warmup)


def layer_overrides(shape: str, system: str, seq: int = SEQ) -> dict[str, dict[str, object]]:
    s = SHAPES[shape]
    return {
        "model": {"num_layers": 1, "num_attention_heads": s["num_attention_heads"],
                  "num_query_groups": s["num_query_groups"], "ffn_hidden_size": s["ffn_hidden_size"],
                  "kv_channels": 128, "seq_length": seq},
        "parallel": {"tp": 1, "pp": 1, "vp": 1, "cp": 1, "sequence_parallel": False},
        "precision": {"compute": "bf16", "params": "bf16", "attention": "bf16"},
        "performance": {"cuda_graphs": "none", "fp8_param_gather": False, "fp4_param_gather": False,
                        "tp_comm_overlap": False, "overlap_grad_reduce": False,
                        "overlap_param_gather": False, "recompute": "none",
                        "gradient_accumulation_fusion": False,
                        "account_for_embedding_in_pipeline_split": False,
                        "account_for_loss_in_pipeline_split": False},
        "system": {"id": system, "racks": 1},
    }


def layer_flops(m: ModelConfig) -> dict[str, float]:
    """Convention FLOPs (forward + backward) of one layer of ModelConfig `m`, by part, for any
    head count (a TP shard built as a TP 1 model has nq x d != hidden)."""
    s, h, f = m.seq_length, m.hidden_size, m.ffn_hidden_size
    q = m.num_attention_heads * m.kv_channels
    qkv = (m.num_attention_heads + 2 * m.num_query_groups) * m.kv_channels
    return {"qkv": 6.0 * s * h * qkv, "attention": 12.0 * s * s * q, "proj": 6.0 * s * q * h,
            "ffn_up": 12.0 * s * h * f, "ffn_down": 6.0 * s * f * h}


def planner_layer(system: str, shape: str, seq: int = SEQ) -> PlannerLayer:
    """The planner's forward and backward seconds of one layer (no embedding, no logits) of
    `shape` on `system`, BF16, CP 1."""
    from ..config.schema import ModelConfig
    from ..planner import compute
    from ..planner.context import Context
    from ..planner.calibrate import fitted
    from ..planner.spec import make_config
    cfg = make_config(system, 1, tp=SHAPES[shape]["tp"], pp=1, vp=1, cp=1, minibs=1,
                      precision="bf16", model=ModelConfig(seq_length=seq))
    fwd, bwd = compute.chunk_parts(Context.of(cfg), 1, False, False, fitted())
    return {"fwd_s": fwd.total, "bwd_s": bwd.total, "attention_s": fwd.attention + bwd.attention}


def bench_layer(config: str | Path, shape: str, *, system: str, iters: int = 10,
                warmup: int = 3, seq: int = SEQ) -> LayerTiming:
    """Forward and backward medians of one layer of `shape` (module docstring). Needs
    torch.distributed and Megatron's parallel state initialised (TP = 1)."""
    import torch
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.typed_torch import apply_module

    from ..config.load import load_config
    from ..model.builder import layer_spec, transformer_config
    cfg = load_config(config, validate=False, overrides=layer_overrides(shape, system, seq))
    tc = transformer_config(cfg)
    tc.gradient_accumulation_fusion = False   # no DDP wrapper: no main_grad buffers
    # Any: megatron-core 0.19.2 leaves build_module's return unannotated (the spec's module)
    layer: TransformerLayer = build_module(layer_spec(cfg, te=False), config=tc,
                                           layer_number=1).to(
        device="cuda", dtype=torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(0)
    h = cfg.model.hidden_size
    x = (torch.randn(seq, 1, h, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
         ).requires_grad_(True)
    dy = torch.randn(seq, 1, h, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device="cuda"), 1)[None, None]
    fwd: list[float] = []
    bwd: list[float] = []
    for i in range(warmup + iters):
        x.grad = None
        layer.zero_grad(set_to_none=True)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        ev[0].record()
        # the layer itself, its arguments checked (megatron-core's typed_torch.apply_module); Any:
        # TransformerLayer.forward's return is unannotated (a tuple: output, context)
        res: tuple[torch.Tensor, torch.Tensor | None] | torch.Tensor = apply_module(layer)(
            hidden_states=x, attention_mask=mask)
        out = res[0] if isinstance(res, tuple) else res
        ev[1].record()
        out.backward(dy)
        ev[2].record()
        ev[2].synchronize()
        if i >= warmup:
            fwd.append(ev[0].elapsed_time(ev[1]) / 1e3)
            bwd.append(ev[1].elapsed_time(ev[2]) / 1e3)
    peak = torch.cuda.max_memory_allocated() / 2**30
    del layer, x, dy, out, res, mask
    torch.cuda.empty_cache()
    flops = layer_flops(cfg.model)
    return {"shape": shape, "seq": seq, "heads": cfg.model.num_attention_heads,
            "query_groups": cfg.model.num_query_groups, "ffn": cfg.model.ffn_hidden_size,
            "fwd_s": statistics.median(fwd), "bwd_s": statistics.median(bwd),
            "flops": sum(flops.values()), "flops_by_part": flops, "peak_gib": round(peak, 1)}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def nvfp4_emulation(shape: tuple[int, int, int] = (4096, 16384, 26624), iters: int = 3,
                    note: Note | None = None) -> Nvfp4Figures:
    """Figures of the nvfp4_emulation check (module docstring); `note(**figures)` is called
    with each figure as soon as it is measured."""
    note = note or (lambda **_: None)
    import torch
    import torch.nn.functional as F

    from ..precision.linear import nvfp4_linear
    from ..precision.nvfp4 import fake_quantize
    g = torch.Generator().manual_seed(3)
    x = torch.randn(512, 2048, generator=g)
    w = torch.randn(1024, 2048, generator=g) * 0.02
    dy = torch.randn(512, 1024, generator=g)
    quant_equal = all(torch.equal(fake_quantize(t, columnwise=c), fake_quantize(
        t.cuda(), columnwise=c).cpu()) for t in (x, w) for c in (False, True))
    out: dict[str, list[torch.Tensor]] = {}
    for dev in ("cpu", "cuda"):
        xd, wd = x.to(dev).requires_grad_(True), w.to(dev).requires_grad_(True)
        y = nvfp4_linear(xd, wd)
        y.backward(dy.to(dev))
        gx, gw = xd.grad, wd.grad
        assert gx is not None and gw is not None   # leaves that require grad, after backward
        out[dev] = [t.detach().cpu() for t in (y, gx, gw)]
    cpu_vs_gpu = max(_rel(a, b) for a, b in zip(out["cuda"], out["cpu"]))
    note(linear_cpu_vs_gpu_rel=cpu_vs_gpu)
    T, K, N = shape
    gc = torch.Generator(device="cuda").manual_seed(4)
    xb = (torch.randn(T, K, device="cuda", generator=gc)).to(torch.bfloat16).requires_grad_(True)
    wb = (torch.randn(N, K, device="cuda", generator=gc) * 0.02).to(torch.bfloat16).requires_grad_(True)
    dyb = torch.randn(T, N, device="cuda", generator=gc).to(torch.bfloat16)
    times: dict[str, float] = {}
    for name, fn in (("nvfp4_emulated", lambda: nvfp4_linear(xb, wb)),
                     ("bf16", lambda: F.linear(xb, wb))):
        ts: list[float] = []
        for i in range(iters + 1):
            xb.grad = wb.grad = None
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            y = fn()
            y.backward(dyb)
            e.record()
            e.synchronize()
            if i:
                ts.append(s.elapsed_time(e) / 1e3)
        times[name] = statistics.median(ts)
        note(fwd_bwd_s=dict(times))
    y = nvfp4_linear(xb, wb)
    error = _rel(y, xb.detach().float() @ wb.detach().float().t())
    del xb, wb, dyb, y
    torch.cuda.empty_cache()
    return {"quantized_operands_bitwise": quant_equal, "linear_cpu_vs_gpu_rel": cpu_vs_gpu,
            "shape_tokens_in_out": list(shape), "rel_error_vs_fp32": error,
            "fwd_bwd_s": times, "slowdown_vs_bf16": times["nvfp4_emulated"] / times["bf16"]}


def _note(rep: Report, name: str, **data: object) -> None:
    """Figures of check `name`, written to the report at once (a killed phase keeps them)."""
    rep.checks[name].data.update(data)
    rep.save()


def ceiling_check(rep: Report, name: str, precision: str, assumed: Assumed, *, system: str,
                  ceiling_fn: Callable[[str], Ceiling] | None = None) -> None:
    """Check `name`: the n^3 ceiling in `precision` beside the dense peak and the planner's
    assumption `assumed` (gemm.planner_assumption); FP8 fails when its product is off the BF16
    one by more than FP8_MAX_REL_ERROR (a wrong scale). `ceiling_fn`: gemm.ceiling's stand-in
    (the unit tests pass a CPU one)."""
    from .gemm import ceiling, gemm_flops
    peak, n = assumed["peak_tflops"], CEILING_N
    planner = gemm_flops(n, n, n) / assumed["ceiling_s"] / 1e12
    _note(rep, name, datasheet_tflops=peak, planner_tflops=planner,
          planner_peak_fraction=assumed["peak_fraction"])
    c = (ceiling_fn or ceiling)(precision)
    detail = (f"{precision.upper()} {c['n']}^3 matrix product: {c['tflops']:.0f} TFLOP/s (median "
              f"of 50) = {c['tflops'] / peak:.0%} of the {system} dense peak {peak:.0f}; the "
              f"planner assumes {planner:.0f} ({assumed['peak_fraction']:.0%} of peak x wave "
              f"efficiency) = {c['tflops'] / planner:.2f} x measured/planner")
    data = dict(c, share_of_peak=c["tflops"] / peak, measured_over_planner=c["tflops"] / planner)
    if precision == "fp8":
        detail += f"; relative error vs BF16 {c['rel_error_vs_bf16']:.3f}"
        if not c["rel_error_vs_bf16"] < FP8_MAX_REL_ERROR:
            rep.failed(name, detail + f" (expected < {FP8_MAX_REL_ERROR})", **data)
            return
    rep.passed(name, detail, **data)


def gemms_check(rep: Report, assumed: Mapping[str, Assumed], *,
                precisions: Sequence[str] = ("bf16", "fp8"),
                shard_fn: ShardGemms | None = None) -> None:
    """Check gemms_tp4: the TP4 shard's linears (gemm.shard_gemms at the planner's shapes),
    each row written to the report as it is measured, beside the dense peak and the planner.
    `shard_fn`: gemm.shard_gemms' stand-in (the unit tests pass a CPU one at small shapes)."""
    from .gemm import LINEARS, against_planner, shard_gemms
    first = assumed[precisions[0]]
    shapes = {k: first["linears"][k]["mnk"] for k in LINEARS}
    data = rep.checks["gemms_tp4"].data
    data.update(tokens=first["tokens"], dense_peak_tflops={p: assumed[p]["peak_tflops"]
                                                           for p in precisions})

    def on_row(name: str, prec: str, row: GemmRow) -> None:
        row.update(against_planner(row, assumed[prec], name))
        data.setdefault(name, {})[prec] = row
        rep.save()
        rep.log(f"gemm {name} {prec}: {row['seconds'] * 1e3:.2f} ms fwd+dgrad+wgrad, "
                f"{row['tflops']:.0f} TFLOP/s = {row['share_of_peak']:.0%} of peak, planner "
                f"{row['planner_tflops']:.0f}")

    rows = (shard_fn or shard_gemms)(shapes, precisions=precisions, on_row=on_row)
    parts = []
    for k, by in rows.items():
        parts.append(f"{k} {'x'.join(map(str, by[precisions[0]]['mnk']))}: " + ", ".join(
            f"{p.upper()} {r['tflops']:.0f} TFLOP/s = {r['share_of_peak']:.0%} of peak "
            f"(planner {r['planner_tflops']:.0f})" for p, r in by.items()))
    detail = "; ".join(parts) + (f" (M x N x K, {first['tokens']} tokens, forward + data + "
                                 "weight gradient)")
    for p in {"bf16", "fp8"} - set(precisions):
        detail += f"; {p.upper()} not timed: its matmul ceiling check did not pass"
    bad = [k for k, by in rows.items()
           if "fp8" in by and not by["fp8"]["rel_error_vs_bf16"] < FP8_MAX_REL_ERROR]
    if bad:
        rep.failed("gemms_tp4", detail + f"; FP8 error vs BF16 over {FP8_MAX_REL_ERROR} at "
                   + ", ".join(bad))
    else:
        rep.passed("gemms_tp4", detail)


def run_layer_phase(rep: Report, cfg: Config, *, system: str, iters: int = 10) -> None:
    """The checks matmul_ceiling, matmul_ceiling_fp8, gemms_tp4, nvfp4_emulation and
    layer_bf16, cheapest first, each figure written to the report as it is measured (needs
    CUDA; layer_bf16 also megatron-core)."""
    import torch

    from ..parallel.setup import seed_model_parallel, teardown_parallel
    from .gemm import planner_assumption
    from .report import Timed
    assumed: dict[str, Assumed] = {}
    for name, prec in CEILINGS.items():
        with Timed(rep, name):
            assumed[prec] = planner_assumption(system, prec)
            ceiling_check(rep, name, prec, assumed[prec], system=system)
    precisions = tuple(p for n, p in CEILINGS.items() if rep.ok(n))
    if not precisions:
        rep.rest_not_run("needs a passed matmul_ceiling or matmul_ceiling_fp8", ["gemms_tp4"])
    elif rep.afford(["gemms_tp4"], 15, "the TP4 shard's GEMMs"):
        with Timed(rep, "gemms_tp4"):
            gemms_check(rep, assumed, precisions=precisions)
    if rep.afford(["nvfp4_emulation"], 20, "the NVFP4 emulation"):
        with Timed(rep, "nvfp4_emulation"):
            e = nvfp4_emulation(note=lambda **f: _note(rep, "nvfp4_emulation", **f))
            detail = (f"quantized operands {'bitwise equal to' if e['quantized_operands_bitwise'] else 'DIFFER from'} "
                      f"the CPU path's; linear fwd+bwd vs CPU {e['linear_cpu_vs_gpu_rel']:.1e} "
                      f"relative; at {e['shape_tokens_in_out']}: error vs FP32 "
                      f"{e['rel_error_vs_fp32']:.3f}, {e['fwd_bwd_s']['nvfp4_emulated'] * 1e3:.1f} ms "
                      f"fwd+bwd = {e['slowdown_vs_bf16']:.1f} x a BF16 linear")
            if e["quantized_operands_bitwise"] and e["linear_cpu_vs_gpu_rel"] < 1e-5:
                rep.passed("nvfp4_emulation", detail, **e)
            else:
                rep.failed("nvfp4_emulation", detail + " (expected: bitwise operands, < 1e-5)", **e)
    if not rep.ok("matmul_ceiling"):
        rep.rest_not_run("needs the matmul_ceiling check", ["layer_bf16"])
        return
    if not rep.afford(["layer_bf16"], 30, "one 405B-width layer in two shapes"):
        return
    peak = assumed["bf16"]["peak_tflops"]
    ceiling: float = rep.checks["matmul_ceiling"].data["tflops"]
    with Timed(rep, "layer_bf16"):
        import torch.distributed as dist
        from megatron.core import parallel_state as ps
        torch.cuda.set_device(0)
        if not dist.is_initialized():
            dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
        if not ps.model_parallel_is_initialized():
            ps.initialize_model_parallel(tensor_model_parallel_size=1,
                                         pipeline_model_parallel_size=1)
        # the same graph-safe RNG tracker the slice makes (Megatron keeps the first one)
        seed_model_parallel(1234, cuda_graphs=True)
        rows: dict[str, LayerRow] = {}
        try:
            for shape in SHAPES:
                b = bench_layer(cfg.source, shape, system=system, iters=iters)
                p = planner_layer(system, shape)
                t = b["fwd_s"] + b["bwd_s"]
                r: LayerRow = {**b, "total_s": t, "model_tflops": b["flops"] / t / 1e12,
                               "mfu_vs_measured_ceiling": b["flops"] / t / 1e12 / ceiling,
                               "mfu_vs_datasheet": b["flops"] / t / 1e12 / peak,
                               "planner_fwd_s": p["fwd_s"], "planner_bwd_s": p["bwd_s"],
                               "planner_attention_s": p["attention_s"],
                               "planner_over_measured": (p["fwd_s"] + p["bwd_s"]) / t}
                rows[shape] = r
                _note(rep, "layer_bf16", **{shape: r})
                rep.log(f"layer {shape}: fwd {r['fwd_s'] * 1e3:.1f} ms, bwd {r['bwd_s'] * 1e3:.1f} "
                        f"ms, MFU {r['mfu_vs_measured_ceiling']:.0%} of the measured ceiling, "
                        f"planner/measured {r['planner_over_measured']:.2f}")
        finally:
            teardown_parallel()
            torch.cuda.empty_cache()
        f = rows["full"]
        rep.passed("layer_bf16", "; ".join(
            f"{k}: fwd {r['fwd_s'] * 1e3:.1f} ms + bwd {r['bwd_s'] * 1e3:.1f} ms, "
            f"{r['model_tflops']:.0f} TFLOP/s = MFU {r['mfu_vs_measured_ceiling']:.0%} of the "
            f"measured ceiling ({r['mfu_vs_datasheet']:.0%} of datasheet), planner "
            f"{(r['planner_fwd_s'] + r['planner_bwd_s']) * 1e3:.1f} ms = "
            f"{r['planner_over_measured']:.2f} x measured" for k, r in rows.items())
            + f" (sequence {f['seq']}, MBS 1, local unfused attention vs the planner's fused "
              "causal kernel)", ceiling_tflops=ceiling)
