"""Memory per GPU: weights, gradients, optimizer state, activations in flight, reserve.

* Weights: the stored parameter (BF16, or FP8/NVFP4 with the low-precision parameter gather)
  plus the quantised copies the GEMMs read (row- and column-wise NVFP4 or FP8 copies, cached
  across microbatches).
* Gradients: the full main-grad buffer (FP32 when grad_reduce_in_fp32).
* Optimizer: FP32 master weights + Adam m and v, sharded over DP x CP by the distributed
  optimizer.
* Activations: per layer and microbatch, the tensors kept for the backward pass with sequence
  parallelism and fused attention (all divided by TP): both norm inputs, Q/K/V, the attention
  output and the FC1 output in BF16, and the GEMM inputs (QKV, projection, FC1, FC2) in the
  compute precision; times the layer-microbatches the fullest pipeline rank holds at its peak
  (pipeline.py).
  Full recomputation keeps only each layer's input plus one layer's working set.
* Fragmentation: the caching allocator's loss on the activations, which churn every microbatch
  (calibrate.constants.ASSUMED.activation_fragmentation); the static buffers do not fragment.
* Reserve: CUDA context, NCCL buffers, workspaces (calibrate.constants.ASSUMED.memory_reserved_gb).

A calibration fitted to a GPU profile with a memory record (`plan --calibrate`; docs/planner.md)
replaces two of these: the activations are scaled by the measured / modelled ratio and the
fragmentation is the measured one (`calibrate.constants.Fitted.activation_scale`,
`activation_fragmentation`); without one (or from a CPU profile) the assumed values hold.
"""
from __future__ import annotations

from dataclasses import dataclass

from .calibrate.constants import ASSUMED, Fitted
from .comm import param_gather_bytes_per_param
from .compute import OPERAND_BYTES
from .context import Context
from .pipeline import peak_layer_microbatches

GB = 1e9


@dataclass(frozen=True, slots=True)
class Memory:
    weights_gb: float
    grads_gb: float
    optimizer_gb: float
    activations_gb: float
    fragmentation_gb: float
    reserved_gb: float
    capacity_gb: float

    @property
    def total_gb(self) -> float:
        return (self.weights_gb + self.grads_gb + self.optimizer_gb + self.activations_gb
                + self.fragmentation_gb + self.reserved_gb)

    @property
    def fits(self) -> bool:
        return self.total_gb <= self.capacity_gb

    def as_dict(self) -> dict[str, float]:
        return {"weights_gb": self.weights_gb, "grads_gb": self.grads_gb,
                "optimizer_gb": self.optimizer_gb, "activations_gb": self.activations_gb,
                "fragmentation_gb": self.fragmentation_gb, "reserved_gb": self.reserved_gb,
                "capacity_gb": self.capacity_gb}

    def why_not(self) -> str:
        return (f"needs {self.total_gb:.0f} GB of {self.capacity_gb:.0f} GB: weights "
                f"{self.weights_gb:.0f}, grads {self.grads_gb:.0f}, optimizer {self.optimizer_gb:.0f}, "
                f"activations {self.activations_gb:.0f}, fragmentation {self.fragmentation_gb:.0f}, "
                f"reserved {self.reserved_gb:.0f}")


def stored_bytes_per_param(ctx: Context) -> float:
    """The parameter as stored: FP8/NVFP4 with the low-precision parameter gather, else its dtype
    (precision.params: FP32 parameters take 4 bytes, as the rehearsal measures)."""
    perf = ctx.cfg.performance
    if ctx.precision in ("fp8", "nvfp4") and (perf.fp8_param_gather or perf.fp4_param_gather):
        return param_gather_bytes_per_param(ctx)
    return 4.0 if ctx.cfg.precision.params == "fp32" else 2.0


def weight_bytes_per_param(ctx: Context) -> float:
    prec = ctx.precision
    stored = stored_bytes_per_param(ctx)
    if prec == "nvfp4":
        copies = OPERAND_BYTES["nvfp4"] * (1 if ctx.cfg.performance.fp4_param_gather else 2)
    elif prec == "fp8":
        copies = 0.0 if ctx.cfg.performance.fp8_param_gather else 2 * OPERAND_BYTES["fp8"]
    else:
        copies = 0.0
    return stored + copies


def activation_bytes_per_token(ctx: Context) -> float:
    """Bytes one layer keeps per token of a microbatch on one GPU (no recomputation)."""
    m = ctx.model
    h, f = m.hidden_size, m.ffn_hidden_size
    kv = 2 * m.num_query_groups * m.kv_channels
    q = OPERAND_BYTES[ctx.precision]
    bf16 = 2.0 * (2 * h + (h + kv) + h + 2 * f)
    gemm_inputs = q * (h + h + f) + (0.0 if ctx.precision in ("bf16", "fp32") else q * h)
    return (bf16 + gemm_inputs) / ctx.tp


def memory(ctx: Context, fit: Fitted | None = None) -> Memory:
    """The fullest GPU's memory; `fit`: a calibration's memory constants (None: the assumed)."""
    params = ctx.params_per_gpu
    cfg = ctx.cfg
    fp32_params = cfg.precision.params == "fp32"
    # gradient buffers: FP32 with grad_reduce_in_fp32, else the parameter dtype
    grad = 4.0 if cfg.precision.grad_reduce_in_fp32 or fp32_params else 2.0
    # FP32 master weights + Adam m, v; FP32 parameters are their own master weights
    opt_bytes = 8.0 if fp32_params else 12.0
    shards = ctx.dp * ctx.cp if cfg.optimizer.distributed else 1
    per_layer = activation_bytes_per_token(ctx) * ctx.tokens
    layers = peak_layer_microbatches(ctx)
    if cfg.performance.recompute == "full":
        act = layers * ctx.tokens * 2.0 * ctx.model.hidden_size / ctx.tp + per_layer
    else:
        act = layers * per_layer
    logits = ctx.tokens * ctx.vocab / ctx.tp * 6.0  # BF16 logits + FP32 softmax gradient, last rank
    act_gb = (act + logits) / GB * (fit.activation_scale if fit else 1.0)
    frag = ASSUMED.activation_fragmentation
    if fit is not None and fit.activation_fragmentation is not None:
        frag = fit.activation_fragmentation
    return Memory(weights_gb=params * weight_bytes_per_param(ctx) / GB, grads_gb=params * grad / GB,
                  optimizer_gb=params * opt_bytes / shards / GB, activations_gb=act_gb,
                  fragmentation_gb=act_gb * frag,
                  reserved_gb=ASSUMED.memory_reserved_gb, capacity_gb=ctx.system.hbm_gb)
