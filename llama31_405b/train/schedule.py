"""The learning-rate schedule of the MLPerf rules: linear warmup, then cosine decay to end_lr.

Indexing: `lr_at(k)` is the LR of the k-th optimizer update (k = 0 for the first update of the
run). It follows the MLCommons reference (NeMo's warmup policy + cosine annealing):

  k <  W:            lr * (k + 1) / (W + 1)         linear ramp from 0; the first update uses
                                                     lr/(W+1), never LR 0
  W <= k <= W + D:   end + (lr - end) * (1 + cos(pi * (k - W) / D)) / 2
  k >  W + D:        end

with W = warmup_steps and D = decay_steps from the rules (cfg.derived). At k = W - 1 the ramp
reaches lr * W/(W+1); at k = W the cosine starts at exactly lr.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:   # megatron.core is imported after the TE environment check (train.loop)
    from megatron.core.optimizer import MegatronOptimizer

    from ..config.schema import Config


@dataclass(frozen=True, slots=True)
class LRSchedule:
    lr: float
    end_lr: float
    warmup_steps: int
    decay_steps: int
    weight_decay: float

    @classmethod
    def from_config(cls, cfg: Config) -> LRSchedule:
        d = cfg.derived
        return cls(lr=d.lr, end_lr=d.end_lr, warmup_steps=d.warmup_steps,
                   decay_steps=d.decay_steps, weight_decay=d.weight_decay)

    def lr_at(self, k: int) -> float:
        if k < 0:
            raise ValueError(f"optimizer step index must be >= 0, got {k}")
        w, dsteps = self.warmup_steps, self.decay_steps
        if k < w:
            return self.lr * (k + 1) / (w + 1)
        if dsteps <= 0 or k > w + dsteps:
            return self.end_lr
        progress = (k - w) / dsteps
        return self.end_lr + (self.lr - self.end_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def apply(self, optimizer: MegatronOptimizer, k: int) -> float:
        """Set LR and weight decay of every parameter group for update k; returns the LR.
        Megatron's param groups carry lr_mult/wd_mult (wd_mult 0 for norms)."""
        lr = self.lr_at(k)
        # megatron-core 0.19.2 MegatronOptimizer.param_groups: the torch optimizer's, through an
        # unannotated property; the multipliers are numbers
        groups: list[dict[str, object]] = optimizer.param_groups
        for group in groups:
            group["lr"] = lr * cast(float, group.get("lr_mult", 1.0))
            group["weight_decay"] = self.weight_decay * cast(float, group.get("wd_mult", 1.0))
        return lr
