"""Predicted vs published for every published figure of Azure's MLPerf Training v6.0 write-up
(and the MLPerf results), with the error; and the sweep's speed for one system and scale.

    PYTHONPATH=. python bench/planner_vs_published.py [--json]

Rows marked `fit` are the calibration inputs (their error is zero by construction); every other
row is a prediction that was not used to fit anything. For the time-to-train rows, `band` is the
time-to-train if the run needs one standard deviation of the reference runs fewer or more
samples (the convergence spread of the RCP data): a published score inside the band is a miss the
convergence spread accounts for. The timing section measures the sweep of each scale (every
layout and batch size, the closed-form screen and the simulation of the best layouts) against
the 2-second budget, after the one-off work (solving the constants, loading the RCPs), as wall
and CPU time (the two differ when other processes share the cores).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llama31_405b.planner import calibration, convergence, fitted, predict  # noqa: E402
from llama31_405b.planner.spec import make_config  # noqa: E402
from llama31_405b.planner.sweep import Fixed, sweep  # noqa: E402
from llama31_405b.planner.writer import SWITCH_MARGIN, plan_scale  # noqa: E402

BUDGET_S = 2.0


def layout(racks, minibs, system="gb200-nvl72", tp=4):
    return predict(make_config(system, racks, tp=tp, pp=8, vp=8, cp=2, minibs=minibs))


def rows() -> list[dict]:
    out = []

    def add(figure, published, predicted, kind, unit="", band=None):
        err = None
        if isinstance(published, (int, float)) and isinstance(predicted, (int, float)) and published:
            err = predicted / published - 1
        out.append(dict(figure=figure, published=published, predicted=predicted, error=err, kind=kind,
                        unit=unit, band=band))

    c = calibration.CALIBRATION
    p128 = layout(128, 8)
    b = p128.breakdown
    comp = b["compute_total_s"]
    gemm = sum(b[f"compute_{k}_s"] for k in ("qkv", "attention", "proj", "ffn_up", "ffn_down", "logits"))
    add("128 racks: step time at GBS 1024, MiniBS 8", c.step_s, p128.step_time_s, "fit", "s")
    add("128 racks: compute per step", c.compute_s, comp, "fit", "s")
    add("128 racks: compute share of the step", 0.57, comp / p128.step_time_s, "fit (57% ~ 733/1270)")
    add("128 racks: GEMM share of compute", c.gemm_share_of_compute, gemm / comp, "fit")
    add("128 racks: FFN share of compute", c.ffn_share_of_compute,
        (b["compute_ffn_up_s"] + b["compute_ffn_down_s"]) / comp, "fit")
    add("128 racks: exposed cross-rack DP", c.dp_exposed_s, b["dp_s"], "prediction (see docs)", "s")
    nvl = b["tp_s"] + b["cp_s"] + b["pp_s"] + b["bubble_s"]
    add("128 racks: NVLink comm + bubbles on the critical path", c.nvlink_critical_s, nvl,
        "consequence of the fit", "s")
    p8 = layout(8, 144)
    add("DP 8, GBS 1152, TP4-PP8-CP2: MFU (10 PFLOP/s FP4 peak)", 0.2645, p8.mfu, "prediction")
    add("128 racks, MiniBS 8: time-to-train", 7.07, p128.time_to_train_min, "prediction", "min",
        p128.time_to_train_range_min)
    p40 = layout(40, 24)
    add("40 racks, MiniBS 24 (GBS 960): time-to-train", 18.79, p40.time_to_train_min, "prediction",
        "min", p40.time_to_train_range_min)
    eff = p40.time_to_train_min * 40 / (p128.time_to_train_min * 128)
    (l40, h40), (l128, h128) = p40.time_to_train_range_min, p128.time_to_train_range_min
    add("scaling efficiency 40 -> 128 racks", 0.83, eff, "prediction", "",
        (l40 * 40 / (h128 * 128), h40 * 40 / (l128 * 128)))
    ranked = [p for p in sweep("gb200-nvl72", 8, Fixed(minibs=144)) if p.fits and p.dp == 8]
    rank = next(i for i, p in enumerate(ranked, 1) if (p.tp, p.pp, p.cp) == (4, 8, 2))
    add("DP 8 / GBS 1152: best fitting layout", "TP4-PP8-CP2",
        f"{ranked[0].layout} (TP4-PP8-CP2 #{rank})", "prediction")
    g2 = predict(make_config("gb200-nvl72", 128, tp=2, pp=8, vp=8, cp=2, minibs=8))
    g3 = predict(make_config("gb300-nvl72", 128, tp=2, pp=8, vp=8, cp=2, minibs=8))
    add("TP2-PP8-CP2, MiniBS 8: fits GB200 / GB300", "no / yes",
        f"{'yes' if g2.fits else 'no'} ({g2.memory_per_gpu_gb:.0f} of 186 GB) / "
        f"{'yes' if g3.fits else 'no'} ({g3.memory_per_gpu_gb:.0f} of 279 GB)", "prediction")
    for racks, published in ((8, 144), (40, 24), (128, 8)):
        sp = plan_scale(racks)
        add(f"{racks} racks: MiniBS (TP4-PP8-VP8-CP2)", published, sp.layout_best.minibs, "prediction")
        add(f"{racks} racks: config written (published layout kept below a "
            f"{SWITCH_MARGIN:.0%} predicted gain)", f"TP4-PP8-VP8-CP2 / {published}",
            f"{sp.chosen.layout} / {sp.chosen.minibs} (best: {sp.best.layout} / {sp.best.minibs}, "
            f"{sp.gain:+.1%})", "writer")
    return out


def timing() -> list[dict]:
    fitted()
    convergence.rcp_points()
    from llama31_405b.planner import costs, step
    out = []
    for racks in (8, 40, 128):
        costs._PLANS.clear()  # noqa: SLF001 (time the sweep from cold caches)
        step._SIMS.clear()  # noqa: SLF001
        t0, c0 = time.perf_counter(), time.process_time()
        res = sweep("gb200-nvl72", racks)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        sim = sum(p.simulated for p in res)
        out.append(dict(racks=racks, candidates=len(res), simulated=sim, seconds=dt, cpu_seconds=cpu,
                        budget_ratio=dt / BUDGET_S))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    data, speed = rows(), timing()
    if args.json:
        print(json.dumps({"figures": data, "sweep_timing": speed}, indent=2))
        return 0
    print(f"| {'figure':<58} | {'published':>11} | {'predicted':>30} "
          f"| {'error':>7} | {'band (RCP spread)':>17} | kind")
    print(f"|{'-' * 60}|{'-' * 13}|{'-' * 32}|{'-' * 9}|{'-' * 19}|------")
    for r in data:
        pub, pred = r["published"], r["predicted"]
        if r["unit"]:
            fmt = lambda v, u=r["unit"]: f"{v:.3f} {u}"  # noqa: E731
        else:
            fmt = lambda v: f"{v:.2%}" if abs(v) < 1 else f"{v:.3f}"  # noqa: E731
        pub_s = fmt(pub) if isinstance(pub, float) else str(pub)
        pred_s = fmt(pred) if isinstance(pred, float) else str(pred)
        err = f"{r['error']:+.1%}" if r["error"] is not None else "-"
        band = "-"
        if r["band"]:
            lo, hi = r["band"]
            inside = "in" if lo <= pub <= hi else "out"
            band = (f"{lo:.2f}-{hi:.2f} {inside}" if r["unit"] else f"{lo:.0%}-{hi:.0%} {inside}")
        print(f"| {r['figure']:<58} | {pub_s:>11} | {pred_s:>30} | {err:>7} | {band:>17} | {r['kind']}")
    print()
    for s in speed:
        print(f"sweep gb200-nvl72 {s['racks']:>3} racks: {s['candidates']:>5} candidates "
              f"({s['simulated']} simulated) in {s['seconds']:.3f} s wall, {s['cpu_seconds']:.3f} s CPU "
              f"({s['budget_ratio']:.2f}x the {BUDGET_S:.0f} s budget; on a shared machine the CPU time "
              f"is the sweep's own)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
