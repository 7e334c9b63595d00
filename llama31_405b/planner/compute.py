"""Compute time of one microbatch (forward + backward) on one GPU, by part of the model.

FLOPs follow the project's convention (config.derived.model_flops_per_sequence: non-causal
Megatron formula, docs/planner.md); `flops_by_part` splits it into QKV, attention core, output
projection, FFN up/gate, FFN down and logits and sums back to it exactly. Times:

* GEMMs: each of forward, data-gradient and weight-gradient GEMM of a linear layer, at the
  precision's achievable peak fraction times a wave-quantisation factor (output tiles against
  SMs, padding of partial tiles), or the HBM time of its operands if that is longer.
* Attention core: the FLOPs a causal fused kernel executes (half the convention's) at a fitted
  fraction of the attention precision's peak.
* Everything else (norms, SwiGLU, RoPE, residuals, quantisation, loss): HBM-bound passes over the
  layer's activations, a fitted number of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import cache

from ..config.schema import ModelConfig
from .calibrate.constants import ASSUMED, Fitted
from .context import Context, Stage

PARTS = ("qkv", "attention", "proj", "ffn_up", "ffn_down", "logits")
CALL_PARTS = ("qkv", "attention", "proj", "ffn", "logits", "elementwise")
"""The parts with a time that TP does not split (`Fitted.call_s`): per layer and sequence for the
GEMMs and the attention, per layer pass for the elementwise work; the FFN's two GEMMs as one (the
profile's FFN share), the LM head per sequence of each microbatch."""
ELEMENTWISE_TP = "elementwise_tp"
"""`Fitted.call_s`'s time a TP rank's layer pass adds to the elementwise work's (TP > 1 only;
model revision 14): work of TP's passes that the model's elementwise width does not count,
which TP2 against DP2 would read as a time per pass of every layout (calibrate/joint.py
`_call_times`)."""

# Bytes per element of a GEMM operand in each compute precision (NVFP4: 4 bits + an E4M3 scale
# per 16 elements).
OPERAND_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp8": 1.0, "nvfp4": 0.5625}


def flops_by_part(model: ModelConfig) -> dict[str, float]:
    """Training FLOPs per sequence (forward + backward = 3x forward) by part, convention of
    config.derived.model_flops_per_sequence; the values sum to it."""
    s, h, f, L = model.seq_length, model.hidden_size, model.ffn_hidden_size, model.num_layers
    qkv = (model.num_attention_heads + 2 * model.num_query_groups) * model.kv_channels
    return {
        "qkv": 6.0 * s * h * qkv * L,
        "attention": 12.0 * s * s * h * L,
        "proj": 6.0 * s * h * h * L,
        "ffn_up": 12.0 * s * h * f * L,
        "ffn_down": 6.0 * s * h * f * L,
        "logits": 6.0 * s * h * model.vocab_size,
    }


def gemm_shapes(ctx: Context) -> dict[str, tuple[int, int, int]]:
    """Forward GEMM (M tokens, N outputs, K inputs) of each linear part on one GPU."""
    m = ctx.model
    h, f, t, T = m.hidden_size, m.ffn_hidden_size, ctx.tp, ctx.tokens
    qkv = (m.num_attention_heads + 2 * m.num_query_groups) * m.kv_channels
    return {"qkv": (T, qkv // t, h), "proj": (T, h, m.num_attention_heads * m.kv_channels // t),
            "ffn_up": (T, 2 * f // t, h), "ffn_down": (T, h, f // t), "logits": (T, ctx.vocab // t, h)}


def wave_efficiency(M: int, N: int, sms: int, tile: tuple[int, int] = (0, 0)) -> float:
    """Useful share of the SM time: padding of partial tiles x the last wave's idle SMs (`tile`:
    the system's output tile, (0, 0) for ASSUMED's)."""
    tm, tn = tile[0] or ASSUMED.gemm_tile_m, tile[1] or ASSUMED.gemm_tile_n
    tiles_m, tiles_n = math.ceil(M / tm), math.ceil(N / tn)
    tiles = tiles_m * tiles_n
    waves = math.ceil(tiles / sms)
    return (M * N) / (tiles_m * tm * tiles_n * tn) * tiles / (waves * sms)


def executed_precision(precision: str, system) -> str:
    """The precision GEMMs of `precision` execute in on `system` (a SystemSpec): emulated NVFP4
    dequantizes and multiplies in FP32 (systems: `nvfp4 = "emulated"`)."""
    if precision == "nvfp4" and system.nvfp4 == "emulated":
        return "fp32"
    return precision


def gemm_precision(ctx: Context) -> str:
    return executed_precision(ctx.precision, ctx.system)


def emulated_gemms(ctx: Context) -> bool:
    """The layout's NVFP4 GEMMs are emulated (`executed_precision` FP32): their quantisation is
    priced apart, as compute and as host time."""
    return gemm_precision(ctx) != ctx.precision


LOW_PRECISION = ("fp8", "nvfp4")
"""Compute precisions applied by Transformer Engine's recipes (or the project's emulation of
NVFP4) to the transformer layers' linears only."""


def part_precision(ctx: Context, part: str) -> str:
    """The precision linear part `part` (compute.PARTS but the attention) runs in, as executed
    on the system. The LM head stays in the parameters' precision under FP8 and NVFP4:
    megatron-core 0.19.2 `GPTModel.__init__` builds the output layer as
    `tensor_parallel.ColumnParallelLinear` (no recipe applies) unless MXFP8's
    `fp8_output_proj` asks for `TELMHeadColumnParallelLinear`, which no config of ours does."""
    if part == "logits" and ctx.precision in LOW_PRECISION:
        return executed_precision(ctx.cfg.precision.params, ctx.system)
    return gemm_precision(ctx)


def gemm_peak_fraction(precision: str, fit: Fitted) -> float:
    """Achievable fraction of `precision`'s peak: fitted for native NVFP4 and for a profiled
    precision (`Fitted.gemm_fraction`), else the assumed one."""
    measured = dict(fit.gemm_fraction)
    if precision in measured:
        return measured[precision]
    if precision == "nvfp4":
        return fit.nvfp4_gemm_peak_fraction
    return dict(ASSUMED.gemm_peak_fraction)[precision]


def gemm_passes(ctx: Context, M: int, N: int, K: int, fit: Fitted,
                part: str = "ffn_up") -> tuple[float, float, float]:
    """Seconds of the forward, data-gradient and weight-gradient GEMMs of a (M, N, K) linear
    layer of `part` (its precision: `part_precision`): compute at the achievable peak and wave
    efficiency, or the HBM time of the operands if longer."""
    sysm, executed = ctx.system, part_precision(ctx, part)
    # the recipe's name where the part runs in it (emulated NVFP4: FP32 peak, NVFP4 operands)
    prec = executed if part == "logits" and ctx.precision in LOW_PRECISION else ctx.precision
    return _gemm_passes(sysm.peak_tflops(prec) * 1e12 * gemm_peak_fraction(executed, fit),
                        OPERAND_BYTES[prec], sysm.hbm_tbs * 1e12, sysm.sm_count,
                        (sysm.gemm_tile_m, sysm.gemm_tile_n), M, N, K)


@cache
def _gemm_passes(peak: float, b_in: float, hbm: float, sms: int, tile: tuple[int, int], M: int,
                 N: int, K: int) -> tuple[float, float, float]:
    out = []
    for m_, n_, k_ in ((M, N, K), (M, K, N), (N, K, M)):  # fwd, dgrad, wgrad
        t_compute = 2.0 * m_ * n_ * k_ / (peak * wave_efficiency(m_, n_, sms, tile))
        t_memory = ((m_ * k_ + k_ * n_) * b_in + m_ * n_ * 2.0) / hbm
        out.append(max(t_compute, t_memory))
    return out[0], out[1], out[2]


def part_passes(ctx: Context, fit: Fitted) -> dict[str, tuple[float, float, float]]:
    """(forward, data-gradient, weight-gradient) seconds of each linear part, with the part's
    measured rate relative to the FFN's (`Fitted.gemm_part_scale`, a profile's shape classes)."""
    out = {}
    for k, shape in gemm_shapes(ctx).items():
        f = fit.scale("gemm_part_scale", k)
        fwd, dgrad, wgrad = gemm_passes(ctx, *shape, fit, k)
        out[k] = (fwd * f, dgrad * f, wgrad * f)
    return out


@dataclass(frozen=True, slots=True)
class PartTimes:
    """Seconds of one microbatch (forward + backward) on one GPU of a pipeline rank."""
    qkv: float
    attention: float
    proj: float
    ffn_up: float
    ffn_down: float
    logits: float
    elementwise: float

    @property
    def ffn(self) -> float:
        return self.ffn_up + self.ffn_down

    @property
    def total(self) -> float:
        return (self.qkv + self.attention + self.proj + self.ffn_up + self.ffn_down + self.logits
                + self.elementwise)

    def scaled(self, k: float) -> "PartTimes":
        return PartTimes(**{f.name: getattr(self, f.name) * k for f in fields(self)})


def attention_flops(ctx: Context) -> float:
    """FLOPs the attention core executes for one layer and microbatch on one GPU, forward +
    backward: a fused causal kernel skips the masked half (half the convention's), the unfused
    attention computes every score (systems: `attention_kernel`)."""
    m = ctx.model
    causal = 3 * 2.0 * m.seq_length ** 2 * m.hidden_size * ctx.mbs / (ctx.cp * ctx.tp)
    return causal * (2 if ctx.system.attention_kernel == "unfused" else 1)


def attention_time(ctx: Context, fit: Fitted) -> float:
    """Attention core of one layer and microbatch on one GPU (forward + backward)."""
    executed = attention_flops(ctx)
    prec = ctx.cfg.precision.attention
    peak = ctx.system.peak_tflops(prec) * 1e12
    return executed / (peak * dict(fit.attention_fraction).get(prec, fit.attention_bf16_fraction))


def probe_factor(ctx: Context, fit: Fitted, op: str, prec: str) -> float:
    """A CPU probe's time of operation `op` (gemm, attention, elementwise) in precision `prec`
    over the profiled precision's (`Fitted.probe_scale`; 1 where the probe did not price it: the
    profiled precision itself, a GPU's calibration). The attention takes the ladder's rung
    nearest this layout's bmm batch, mbs x heads / TP, the GEMMs the rung nearest its LM head's
    vocabulary shard, vocabulary / TP (model revision 23; in log2, the smaller on a tie)."""
    scale = dict(fit.probe_scale)
    prefix, size = {"attention": ("attention-b", ctx.mbs * ctx.model.num_attention_heads / ctx.tp),
                    "gemm": ("gemm-v", ctx.vocab / ctx.tp)}.get(op, ("", 0.0))
    rungs = {int(k.partition("_")[0][len(prefix):]): v for k, v in scale.items()
             if prefix and k.startswith(prefix) and k.endswith("_" + prec)}
    nearest = min(rungs, key=lambda b: (abs(math.log2(b / size)), b), default=0)
    return rungs.get(nearest) or scale.get(f"{op}_{prec}", 1.0)


def part_factors(ctx: Context, fit: Fitted) -> dict[str, float]:
    """Each part's `probe_factor` in the precision it runs in; "quantisation": the emulated
    NVFP4 linears' extra time over their FP32 GEMMs' (0 but for emulated NVFP4 with a probe),
    counted as elementwise work."""
    out = {k: probe_factor(ctx, fit, "gemm", part_precision(ctx, k)) for k in PARTS if k != "attention"}
    out["attention"] = probe_factor(ctx, fit, "attention", ctx.cfg.precision.attention)
    out["elementwise"] = probe_factor(ctx, fit, "elementwise", ctx.cfg.precision.params)
    quantised = emulated_gemms(ctx)
    out["quantisation"] = probe_factor(ctx, fit, "gemm", "nvfp4") - 1 if quantised else 0.0
    return out


def elementwise_width(ctx: Context, logits: bool) -> tuple[float, float]:
    """Activation elements per token of one layer on one GPU touched by non-GEMM kernels:
    two norm inputs and the residual stream (4h), the QKV output (RoPE), the FFN's 2f input and f
    output of SwiGLU; the loss adds 2 x V (FP32 logits) on the last rank. The norms and the
    residual stream are split over TP only with sequence parallelism; without it (the CPU path:
    megatron-core's local norms) every TP rank runs them on the whole hidden state
    (megatron-core 0.19.2 `TransformerLayer`: its layernorms and bias-dropout-add take the
    full [s, b, h] input unless `sequence_parallel` shards s)."""
    m = ctx.model
    qkv = (m.num_attention_heads + 2 * m.num_query_groups) * m.kv_channels
    norms = 4 * m.hidden_size / (ctx.tp if ctx.cfg.parallel.sequence_parallel else 1)
    width = norms + (qkv + 3 * m.ffn_hidden_size) / ctx.tp
    if ctx.system.attention_kernel == "unfused":  # the scores: masked, soft-maxed, in memory
        width += m.num_attention_heads * m.seq_length / (ctx.cp * ctx.tp)
    return width, (2.0 * ctx.vocab / ctx.tp if logits else 0.0)


def stage_parts(ctx: Context, st: Stage, fit: Fitted) -> PartTimes:
    """Compute of one microbatch on one GPU of pipeline rank `st`."""
    n = st.layers
    f = part_factors(ctx, fit)
    g = {k: sum(t) * f[k] for k, t in part_passes(ctx, fit).items()}
    layer_w, loss_w = elementwise_width(ctx, st.logits)
    ew = (fit.elementwise_passes * ctx.tokens * 2.0 * (n * layer_w + loss_w) / (ctx.system.hbm_tbs * 1e12)
          * f["elementwise"])
    quant = n * sum(g[k] for k in ("qkv", "proj", "ffn_up", "ffn_down")) * f["quantisation"]
    return PartTimes(qkv=n * g["qkv"], attention=n * attention_time(ctx, fit) * f["attention"],
                     proj=n * g["proj"], ffn_up=n * g["ffn_up"], ffn_down=n * g["ffn_down"],
                     logits=g["logits"] if st.logits else 0.0, elementwise=ew + quant)


def chunk_parts(ctx: Context, layers: int, embedding: bool, logits: bool,
                fit: Fitted) -> tuple[PartTimes, PartTimes]:
    """(forward, backward) compute of one microbatch through a model chunk of `layers` layers on
    one GPU, with the embedding and/or the output layer and loss when the chunk holds them. The
    backward holds the data- and weight-gradient GEMMs, 2/3 of the attention and of the
    elementwise work (the convention's 3 x forward), and of each part's time that TP does not
    split (`Fitted.call_s`: per sequence for the GEMMs and the attention, per pass for the
    elementwise work)."""
    g = part_passes(ctx, fit)
    att = attention_time(ctx, fit)
    f = part_factors(ctx, fit)  # a CPU probe's precisions: the whole part, rate and calls
    layer_w, loss_w = elementwise_width(ctx, logits)
    emb_w = ctx.model.hidden_size if embedding else 0.0  # lookup and its gradient, unsharded rows
    ew = (fit.elementwise_passes * ctx.tokens * 2.0 * (layers * layer_w + loss_w + emb_w)
          / (ctx.system.hbm_tbs * 1e12)) * f["elementwise"]
    # forward 1/3 of it, backward 2/3 (one GEMM, then two); per sequence of the microbatch for
    # the GEMMs and the attention, per pass for the elementwise work (`Fitted.call_s`)
    call = {k: v * (1 if k.startswith("elementwise") else ctx.mbs) for k, v in fit.call_s}
    call["elementwise"] = (call.get("elementwise", 0.0)
                           + call.get(ELEMENTWISE_TP, 0.0) * (ctx.tp > 1))
    ffn = call.get("ffn", 0.0) / 2
    out = []
    for lo, hi, share in ((0, 1, 1 / 3), (1, 3, 2 / 3)):
        t = {k: sum(g[k][lo:hi]) for k in g}
        lin = {"qkv": t["qkv"] + call.get("qkv", 0.0) * share,
               "proj": t["proj"] + call.get("proj", 0.0) * share,
               "ffn_up": t["ffn_up"] + ffn * share, "ffn_down": t["ffn_down"] + ffn * share}
        lin = {k: v * f[k] for k, v in lin.items()}
        quant = layers * sum(lin.values()) * f["quantisation"]
        out.append(PartTimes(qkv=layers * lin["qkv"],
                             attention=layers * (att + call.get("attention", 0.0)) * share * f["attention"],
                             proj=layers * lin["proj"], ffn_up=layers * lin["ffn_up"],
                             ffn_down=layers * lin["ffn_down"],
                             logits=((t["logits"] + call.get("logits", 0.0) * share) * f["logits"]
                                     if logits else 0.0),
                             elementwise=(ew + layers * call.get("elementwise", 0.0) * f["elementwise"])
                             * share + quant))
    return out[0], out[1]


def part_rates(ctx: Context, fit: Fitted) -> dict[str, float]:
    """Predicted TFLOP/s of each part of one layer on one GPU (convention FLOPs for GEMMs,
    executed causal FLOPs for attention), forward + backward."""
    shapes, g = gemm_shapes(ctx), part_passes(ctx, fit)
    out = {k: 6.0 * M * N * K / sum(g[k]) / 1e12 for k, (M, N, K) in shapes.items()}
    out["attention"] = attention_flops(ctx) / attention_time(ctx, fit) / 1e12
    return out
