"""The planner's memory prediction for one pipeline rank of a config: the one place the rehearsal
reads the planner (planner/context.py and planner/memory.py as they are; when the planner's API
changes, only this module follows).

`planner.memory.memory(ctx)` predicts the fullest pipeline rank. Its weight, gradient and
optimizer terms are linear in the parameters a GPU holds, so the prediction for the rank's own
stage scales them by `ctx.stage_params(stage) / ctx.params_per_gpu`; activations, fragmentation
and the reserve stay the planner's figures for the fullest rank (labelled so in the report).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

GB = 1e9


@dataclass(frozen=True, slots=True)
class PlannerMemory:
    stage: str
    """The planner's kind of pipeline rank: first, middle, last (or all)."""
    params: float
    """Parameters on one GPU of this stage."""
    weights: float
    """Bytes of the stored parameters (without the quantized copies)."""
    te_copies: float
    """Bytes of the quantized weight copies the GEMMs read (TE's NVFP4/FP8 copies)."""
    grads: float
    optimizer: float
    """FP32 master weights + Adam m and v, sharded by the distributed optimizer."""
    activations: float
    """Fullest pipeline rank, as the planner models it."""
    fragmentation: float
    reserved: float
    capacity: float

    def as_dict(self) -> dict:
        return asdict(self)


def stage_of(ctx, pp_rank: int):
    """The planner's Stage for pipeline rank `pp_rank`."""
    stages = {s.name: s for s in ctx.stages}
    if len(stages) == 1:
        return ctx.stages[0]
    if pp_rank == 0:
        return stages["first"]
    if pp_rank == ctx.pp - 1:
        return stages["last"]
    return stages["middle"]


def predict(cfg, pp_rank: int) -> PlannerMemory:
    from ..planner.context import Context
    from ..planner.memory import memory, stored_bytes_per_param, weight_bytes_per_param
    ctx = Context.of(cfg)
    mem = memory(ctx)
    stage = stage_of(ctx, pp_rank)
    params = ctx.stage_params(stage)
    scale = params / ctx.params_per_gpu
    # the stored parameter; the rest of the planner's weight bytes are the quantized copies
    stored = stored_bytes_per_param(ctx)
    copies = weight_bytes_per_param(ctx) - stored
    return PlannerMemory(
        stage=stage.name, params=params, weights=params * stored, te_copies=params * copies,
        grads=mem.grads_gb * GB * scale, optimizer=mem.optimizer_gb * GB * scale,
        activations=mem.activations_gb * GB, fragmentation=mem.fragmentation_gb * GB,
        reserved=mem.reserved_gb * GB, capacity=mem.capacity_gb * GB)
