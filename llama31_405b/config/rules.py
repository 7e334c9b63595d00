"""MLPerf rules as one function of the global batch size.

`hparams(rules, gbs)` is the only place that computes learning rate, warmup, decay, evaluation
cadence and the fixed AdamW settings. The constants of each benchmark are one `BenchmarkRules`
value: `LLAMA31_405B` mirrors the closed llama31_405b rules of MLPerf Training 6.0 (ruleset 6.0.0,
the compliance checker's `closed_llama31_405b.yaml`); `TINY_LLAMA31` is this project's scaled-down
CPU benchmark with the same formulas (its rules file lives in compliance/).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

RULESET = "6.0.0"
"""The MLPerf Training ruleset these constants mirror (mlperf-logging's `--ruleset`/`rcp_version`):
the checkers' own default, 6.1.0, has dropped llama31_405b."""


@dataclass(kw_only=True, frozen=True, slots=True)
class BenchmarkRules:
    name: str
    """submission_benchmark value."""
    ref_gbs: int
    """Batch size the LR and step counts are quoted at (llama31_405b: 1152)."""
    base_lr: float
    """Peak LR at ref_gbs; lr = gbs * base_lr / ref_gbs (exact float, see lr_passes_checker)."""
    end_lr: float
    """Final LR of the cosine decay."""
    warmup_ref_steps: int
    """Warmup steps at ref_gbs; warmup = ceil(warmup_ref_steps * ref_gbs / gbs)."""
    total_ref_steps: int
    """Warmup + decay steps at ref_gbs; decay = ceil(total_ref_steps * ref_gbs / gbs) - warmup."""
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    weight_decay: float
    clip_grad: float
    decay_schedule: str
    """opt_learning_rate_decay_schedule value."""
    eval_every_samples: int
    """Evaluation interval in samples; interval = ceil(eval_every_samples / gbs) steps."""
    eval_skip_slope: float
    """The first floor(eval_skip_slope * gbs + eval_skip_offset) evaluations are skipped."""
    eval_skip_offset: float
    eval_samples: int
    """Validation sequences per evaluation."""
    target: float
    """Target validation log perplexity (<=)."""
    seq_length: int
    """max_sequence_length the rules require."""
    max_gbs: int
    """Largest GBS with a reference convergence point."""
    rcp_gbs: tuple[int, ...]
    """Batch sizes with reference convergence points."""


LLAMA31_405B = BenchmarkRules(
    name="llama31_405b", ref_gbs=1152, base_lr=8e-5, end_lr=8e-7,
    warmup_ref_steps=8000, total_ref_steps=1_200_000,
    adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-5, weight_decay=0.1, clip_grad=1.0,
    decay_schedule="cosine with linear warmup",
    eval_every_samples=18432, eval_skip_slope=0.0026, eval_skip_offset=12.0,
    eval_samples=5760, target=5.6, seq_length=8192, max_gbs=4608, rcp_gbs=(1152, 2304, 4608),
)

# The CPU benchmark: same formulas, constants scaled so a 2-core laptop reaches the target in
# minutes. The run continues pre-training the project's tiny initial checkpoint (validation log
# perplexity ~6.1 after its 120-step pre-training, train.pretrain) and, like the real run, it
# converges while the LR is still near the end of its warmup: at GBS 8 the LR ramps to 4e-3 over
# 100 steps, evaluations every 20 steps from step 40, and the 5.6 target is reached after
# ~160-180 steps (~1.5 min of training on 2 cores).
TINY_LLAMA31 = BenchmarkRules(
    name="tiny_llama31", ref_gbs=8, base_lr=4e-3, end_lr=4e-5,
    warmup_ref_steps=100, total_ref_steps=2000,
    adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-5, weight_decay=0.1, clip_grad=1.0,
    decay_schedule="cosine with linear warmup",
    eval_every_samples=160, eval_skip_slope=0.0, eval_skip_offset=1.0,
    eval_samples=64, target=5.6, seq_length=256, max_gbs=64, rcp_gbs=(8,),
)

BENCHMARKS: dict[str, BenchmarkRules] = {r.name: r for r in (LLAMA31_405B, TINY_LLAMA31)}


@dataclass(kw_only=True, frozen=True, slots=True)
class HParams:
    lr: float
    end_lr: float
    warmup_steps: int
    decay_steps: int
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    weight_decay: float
    clip_grad: float
    decay_schedule: str
    eval_interval_steps: int
    first_eval_step: int
    eval_samples: int
    target: float


def lr_for(rules: BenchmarkRules, gbs: int) -> float:
    """The exact-float LR: the checker tests `lr * ref_gbs == gbs * base_lr`, so divide last."""
    return gbs * rules.base_lr / rules.ref_gbs


def checker_lr(rules: BenchmarkRules, gbs: int) -> float | None:
    """The float64 LR that passes the checker's `lr * ref_gbs == gbs * base_lr`, or None.

    Products are monotonic in lr and one ulp of lr moves the product by about one ulp, so only
    the quotient and its two float neighbours can satisfy the equality."""
    lr = lr_for(rules, gbs)
    for cand in (lr, math.nextafter(lr, 0.0), math.nextafter(lr, math.inf)):
        if cand * rules.ref_gbs == gbs * rules.base_lr:
            return cand
    return None


def lr_passes_checker(rules: BenchmarkRules, gbs: int) -> bool:
    return checker_lr(rules, gbs) is not None


def hparams(rules: BenchmarkRules, gbs: int) -> HParams:
    """All rule-fixed hyperparameters for a global batch size."""
    if gbs <= 0:
        raise ValueError(f"global batch size must be positive, got {gbs}")
    lr = checker_lr(rules, gbs) or lr_for(rules, gbs)  # validate rejects the None case
    warmup = math.ceil(rules.warmup_ref_steps * rules.ref_gbs / gbs)
    decay = math.ceil(rules.total_ref_steps * rules.ref_gbs / gbs) - warmup
    interval = math.ceil(rules.eval_every_samples / gbs)
    skipped = math.floor(rules.eval_skip_slope * gbs + rules.eval_skip_offset)
    return HParams(
        lr=lr, end_lr=rules.end_lr, warmup_steps=warmup, decay_steps=decay,
        adam_beta1=rules.adam_beta1, adam_beta2=rules.adam_beta2, adam_eps=rules.adam_eps,
        weight_decay=rules.weight_decay, clip_grad=rules.clip_grad,
        decay_schedule=rules.decay_schedule, eval_interval_steps=interval,
        first_eval_step=(skipped + 1) * interval, eval_samples=rules.eval_samples,
        target=rules.target,
    )


def rules_for(benchmark: str) -> BenchmarkRules:
    try:
        return BENCHMARKS[benchmark]
    except KeyError:
        raise ValueError(f"unknown benchmark {benchmark!r}; known: {', '.join(BENCHMARKS)}") from None
