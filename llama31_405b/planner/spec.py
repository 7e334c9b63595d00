"""A planner candidate is a real `Config`: built here, checked by the project's validator.

`make_config` builds the 405B config a run on `system` with a layout would use (the GPU settings
of configs/base/gb200_405b.toml on Blackwell; FP8 or BF16 where NVFP4 is missing), so layout
validity (heads vs TP, pipeline split, microbatches vs PP, the LR rule, GBS limits, placement in a
rack) comes from `config.validate.problems`, the one place those rules live. The planner adds only
what the validator cannot know: memory fit (memory.py).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Literal, cast, get_args

from ..config.rcp import max_steps_for
from ..config.schema import (BatchConfig, Config, ModelConfig, ParallelConfig, PerformanceConfig,
                             Precision, PrecisionConfig, RunConfig, SystemConfig)
from ..config.validate import problems
from ..systems import load_system

Recompute = Literal["none", "selective", "full"]
"""performance.recompute's values (config.schema.PerformanceConfig)."""

DDP_BUCKET_SIZE = 134_217_728
"""Elements per gradient bucket of the shipped GPU configs (configs/base/gb200_405b.toml)."""
WARMUP_ITERS = 2
"""Untimed warm-up iterations before run_start, as the base (configs/base/gb200_405b.toml)."""


def default_precision(system_id: str) -> str:
    """NVFP4 where the GPU runs it natively, else FP8 (Hopper), else BF16."""
    s = load_system(system_id)
    if s.nvfp4 == "native":
        return "nvfp4"
    return "fp8" if s.peak_tflops_fp8 > 0 else "bf16"


def pipeline_split_flags(num_layers: int, pp: int, vp: int) -> tuple[bool, bool] | None:
    """Embedding/loss accounting that splits the layers evenly over PP x VP chunks (both counted
    first, as the submissions do), or None when no choice divides."""
    for emb, loss in ((True, True), (False, False), (True, False)):
        if (num_layers + emb + loss) % (pp * vp) == 0 and (pp > 1 or not (emb or loss)):
            return emb, loss
    return None


def make_config(system: str, racks: int, *, tp: int, pp: int, vp: int, cp: int, minibs: int,
                mbs: int = 1, precision: str | None = None, recompute: str = "none",
                model: ModelConfig | None = None) -> Config:
    """The Config of a 405B run with this layout (not validated: call `layout_problems`). On the
    'cpu' system the GPU-only settings (CUDA graphs, sequence parallelism, FP8 gather) are off.
    As the base: BF16 gradient reduction, NVFP4 parameters gathered in BF16, full-iteration CUDA
    graphs with its two warm-up iterations, its DDP bucket size, and run.max_steps by the rule of the shipped configs (config.rcp.max_steps_for)."""
    model = model or ModelConfig()
    precision = precision or default_precision(system)
    if precision not in get_args(Precision):
        raise ValueError(f"precision {precision!r}: not one of {get_args(Precision)}")
    if recompute not in get_args(Recompute):
        raise ValueError(f"recompute {recompute!r}: not one of {get_args(Recompute)}")
    flags = pipeline_split_flags(model.num_layers, pp, vp) or (False, False)
    gpu = load_system(system).is_gpu
    low = precision == "fp8" and gpu
    cfg = Config(
        model=model,
        parallel=ParallelConfig(tp=tp, pp=pp, vp=vp, cp=cp, sequence_parallel=tp > 1 and gpu),
        batch=BatchConfig(minibs=minibs, micro_batch_size=mbs),
        precision=PrecisionConfig(compute=cast(Precision, precision), params="bf16", attention="bf16",
                                  grad_reduce_in_fp32=False),
        performance=PerformanceConfig(
            # the base's full-iteration graphs where the layout allows them (not with a
            # non-interleaved pipeline: config.validate_gpu.cuda_graph_rules); the step-time
            # model does not depend on the graph mode
            cuda_graphs="full_iteration" if gpu and (pp == 1 or vp > 1) else "none",
            overlap_grad_reduce=True,
            overlap_param_gather=True, fp8_param_gather=low,
            recompute=cast(Recompute, recompute),
            ddp_bucket_size=DDP_BUCKET_SIZE if gpu else None,
            account_for_embedding_in_pipeline_split=flags[0],
            account_for_loss_in_pipeline_split=flags[1]),
        system=SystemConfig(id=system, racks=racks),
        source=f"<planner {system} {racks} racks tp{tp} pp{pp} vp{vp} cp{cp} minibs{minibs}>",
    )
    # the base's two warm-up iterations: one eager, then the full-iteration capture, both before
    # run_start (config.validate_gpu.cuda_graph_rules)
    return replace(cfg, run=RunConfig(max_steps=max_steps_for("llama31_405b", cfg.derived.gbs),
                                      warmup_iters=WARMUP_ITERS if gpu else 0))


def layout_problems(cfg: Config) -> list[str]:
    """The config validator's verdict (empty list: a valid layout)."""
    return problems(cfg)
