"""Solve the fitted constants (`calibration.Fitted`) so that the simulated calibration step
reproduces the published one: the compute of the busiest GPU (733 ms, with the contention of
the overlapped DP collectives; a pipeline rank with a full share of the layers, `step.busiest_rank`),
its GEMM (74%) and FFN (54%) shares, and the 1.27 s step.

The compute constants follow from the time each part takes at the current constants (GEMM and
attention time are inversely proportional to their efficiency, elementwise time proportional to
its passes); the NVLink efficiency closes the step (secant on 1/efficiency, which the
communication time is proportional to). The slowdown depends on the constants, so the two are
repeated until nothing moves (a handful of rounds, each a few simulations of the 8-microbatch
step). This module imports the model; the model never imports it: the constants reach it as an
argument.
"""
from __future__ import annotations

from dataclasses import replace
from functools import cache

from .calibration import CALIBRATION, INITIAL, CalibrationPoint, Fitted
from .context import Context
from .costs import plan
from .spec import make_config
from .step import breakdown, rank_compute


def _close_step(ctx: Context, fit: Fitted, target: float) -> Fitted:
    """The NVLink efficiency for which the simulated step is `target` seconds."""
    x0 = 1 / fit.nvlink_bus_efficiency
    y0 = breakdown(ctx, fit).step_s - target
    x1 = x0 * 1.05
    for _ in range(30):
        y1 = breakdown(ctx, replace(fit, nvlink_bus_efficiency=1 / x1)).step_s - target
        if abs(y1) < 1e-9 or y1 == y0:
            break
        x0, y0, x1 = x1, y1, x1 - y1 * (x1 - x0) / (y1 - y0)
        if x1 <= 0:
            raise ValueError("calibration: the step leaves no time for NVLink communication")
    return replace(fit, nvlink_bus_efficiency=1 / x1)


def solve(c: CalibrationPoint = CALIBRATION) -> Fitted:
    cfg = make_config(c.system, c.racks, tp=c.tp, pp=c.pp, vp=c.vp, cp=c.cp, minibs=c.minibs)
    ctx = Context.of(cfg)
    fit = INITIAL
    for _ in range(20):
        b = breakdown(ctx, fit)
        clean = c.compute_s - b.dp_slowdown_s
        now = rank_compute(ctx, fit, b.rank)  # seconds of each part per step
        fixed = sum(ch.first_fwd_s for ch in plan(ctx, fit).chunks[b.rank])
        unit = {k: v * fit.nvfp4_gemm_peak_fraction for k, v in now.items()}
        unit["attention"] = now["attention"] * fit.attention_bf16_fraction
        unit["elementwise"] = (now["elementwise"] - fixed) / fit.elementwise_passes
        ffn = c.ffn_share_of_compute * clean
        eta = (unit["ffn_up"] + unit["ffn_down"]) / ffn
        other = (unit["qkv"] + unit["proj"] + unit["logits"]) / eta
        attn = c.gemm_share_of_compute * clean - ffn - other
        if attn <= 0:
            raise ValueError("calibration: the GEMM share leaves no time for attention")
        passes = ((1 - c.gemm_share_of_compute) * clean - fixed) / unit["elementwise"]
        new = replace(fit, nvfp4_gemm_peak_fraction=eta, elementwise_passes=passes,
                      attention_bf16_fraction=unit["attention"] / attn)
        new = _close_step(ctx, new, c.step_s)
        done = all(abs(getattr(new, f) / getattr(fit, f) - 1) < 1e-10 for f in Fitted.__slots__)
        fit = new
        if done:
            break
    return fit


@cache
def fitted() -> Fitted:
    """The constants of the published calibration point (solved once per process)."""
    return solve()
