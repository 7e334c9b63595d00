"""Config -> the MLPerf header events, as one pure function.

The training loop logs exactly these events between init_start and init_stop, and the compliance
precheck feeds the same events to the real checker before any cluster time is spent. Values come
from the config and from `config.rules` via `Config.derived`; nothing is computed twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.schema import Config

_PRECISION_NAME = {"fp32": "fp32", "bf16": "bfloat16", "fp8": "fp8", "nvfp4": "nvfp4"}
_ORDER = ["fp32", "bf16", "fp8", "nvfp4"]   # highest to lowest precision


@dataclass(frozen=True, slots=True)
class Event:
    key: str
    value: Any
    metadata: dict = field(default_factory=dict)


def comm_precisions(cfg: Config) -> dict[str, str]:
    """The precision of each kind of data the run communicates:
    - gradient reduction: FP32 with precision.grad_reduce_in_fp32, else the parameter dtype
      (megatron-core 0.19.2 DDP grad buffers: `torch.float if grad_reduce_in_fp32 else
      param.dtype`);
    - parameter all-gather (distributed optimizer): NVFP4/FP8 with fp4/fp8_param_gather, else the
      parameter dtype;
    - activations between TP/CP/PP ranks: the parameter dtype, except the TP all-gather of the
      sequence-parallel GEMM inputs under FP8/NVFP4 compute, which Transformer Engine quantizes
      before gathering (TE 2.20.2 transformer_engine.pytorch.module.layernorm_linear forward ->
      distributed.gather_along_first_dim with the input quantizer)."""
    pr, perf, p = cfg.precision, cfg.performance, cfg.parallel
    out: dict[str, str] = {"gradient reduction": "fp32" if pr.grad_reduce_in_fp32 else pr.params,
           "activations": pr.params}
    if cfg.optimizer.distributed:
        out["parameter all-gather"] = ("nvfp4" if perf.fp4_param_gather else
                                       "fp8" if perf.fp8_param_gather else pr.params)
    if p.tp > 1 and p.sequence_parallel and pr.compute in ("fp8", "nvfp4"):
        out["sequence-parallel GEMM input all-gather"] = pr.compute
    return out


def lowest_precisions(cfg: Config) -> dict[str, str]:
    """MLPerf 6.0 optional keys lowest_numerical_precision_in_{linear,attn,comm}; comm is the
    lowest of `comm_precisions` (with BF16 parameters, BF16 gradient reduction changes nothing
    there: the parameter gather and activations are BF16 already)."""
    pr = cfg.precision
    lowest_comm = max(comm_precisions(cfg).values(), key=_ORDER.index)
    return {
        "lowest_numerical_precision_in_linear": _PRECISION_NAME[pr.compute],
        "lowest_numerical_precision_in_attn": _PRECISION_NAME[pr.attention],
        "lowest_numerical_precision_in_comm": _PRECISION_NAME[lowest_comm],
    }


def header_events(cfg: Config, *, seed: int) -> list[Event]:
    """Every event of the MLPerf header for one run of `cfg` with `seed`, in logging order."""
    d = cfg.derived
    ev: list[tuple[str, Any]] = [
        ("submission_benchmark", d.rules.name),
        ("submission_org", cfg.run.org),
        ("submission_division", cfg.run.division),
        ("submission_status", cfg.run.status),
        ("submission_platform", d.platform),
        ("seed", seed),
        ("global_batch_size", d.gbs),
        ("gradient_accumulation_steps", d.gradient_accumulation_steps),
        ("max_sequence_length", cfg.model.seq_length),
        ("eval_samples", d.eval_samples),
        # the samples the run asks the dataset for (max_steps x GBS). The published reference
        # logs logged a constant here whose meaning is unverified (docs/compliance.md)
        ("train_samples", d.max_steps * d.gbs),
        ("init_checkpoint_step", cfg.checkpoint.init_step),
        ("opt_name", "adamw"),
        ("opt_base_learning_rate", d.lr),
        ("opt_end_learning_rate", d.end_lr),
        ("opt_learning_rate_warmup_steps", d.warmup_steps),
        ("opt_learning_rate_decay_steps", d.decay_steps),
        ("opt_learning_rate_decay_schedule", d.decay_schedule),
        ("opt_adamw_beta_1", d.adam_beta1),
        ("opt_adamw_beta_2", d.adam_beta2),
        ("opt_adamw_epsilon", d.adam_eps),
        ("opt_adamw_weight_decay", d.weight_decay),
        ("opt_gradient_clip_norm", d.clip_grad),
        ("max_steps", d.max_steps),   # the cap (run.max_steps), else the end of the LR schedule
        ("target_accuracy", d.target),
        *lowest_precisions(cfg).items(),
        ("tensor_parallelism", cfg.parallel.tp),
        ("pipeline_parallelism", cfg.parallel.pp),
        ("context_parallelism", cfg.parallel.cp),
        ("micro_batch_size", cfg.batch.micro_batch_size),
        ("config_filename", Path(cfg.source).name if cfg.source else ""),
    ]
    return [Event(k, v) for k, v in ev]
