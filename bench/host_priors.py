"""The CPU's host-time priors (systems/cpu.toml `host_s_per_step`, `host_s_per_layer_token`),
fitted from the committed 2-rank FP32 profiles of the planner's proof (docs/planner.md, "Model
revision 18"; revision 13 fitted them on the 2-rank DP layouts alone).

A profile's host time (host gaps + other communication exposed, what the calibration reads as
`host_s`), on its compared rank, is fitted by least squares over every committed 2-rank FP32
layout (no rank waits for a core; DP, TP, PP and interleaved, the tiny model) as

    host = F + passes x (h + b x tokens of the microbatch)

F the host time per step outside the layer passes (the optimizer's Python, the step's own
calls), h the time per layer pass, b its growth per token; passes = the microbatches x the rank's
layers (the embedding and the loss counted as layers) x 2, as the planner counts them
(`costs.chunk_slots`, `costs.chunk_cost`). Each layout counts once: the median over the runs
that measured it of each run's median over its rounds. The proof's unseen layouts
(bench/planner_proof.toml) are left out wherever they were measured: the priors must not have
seen them.

F holds the world group's few small collectives of the step's end ("other comm exposed", some
2 ms), which the planner also prices in the optimizer's time: a calibration's fixed part per
pass absorbs the difference. The planner takes F less its own assumed host work per step
(`Assumed.host_step_overhead_s`, added on every system) as `host_s_per_step` and b as
`host_s_per_layer_token`; h is what a calibration fits (`host_s_per_layer_pass`). The committed
priors come from the runs from `--after` to before `--before` (default: the machine the proof
runs on, up to the time they were set); later runs change the fit, which this script shows.
Never part of `make test`.

    PYTHONPATH=. .venv/bin/python bench/host_priors.py [--after 2026-12-06T2130Z] [--before T]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tomllib
from collections import defaultdict
from pathlib import Path

import numpy as np

from llama31_405b.config.load import load_config
from llama31_405b.planner.calibrate.constants import ASSUMED
from llama31_405b.planner.context import Context
from llama31_405b.planner.costs import chunk_slots

ROOT = Path(__file__).resolve().parents[1]
PROOF = ROOT / "docs" / "planner_proof"


def run_time(folder: str) -> str:
    """The UTC date and time a run or extra folder is named by (`2026-12-05T1200Z`)."""
    return folder.removeprefix("extra_")[:16]


def unseen() -> set[str]:
    """The proof's unseen layouts' names (bench/planner_proof.toml)."""
    spec = tomllib.loads((ROOT / "bench" / "planner_proof.toml").read_text())
    return {n for sec in spec["sections"].values() for n in sec["unseen"]}


def passes(ctx: Context, rank: int) -> int:
    """Layer passes a step of the global `rank` (rank order tp-cp-ep-pp-dp:
    parallel/layout.py), the embedding and the loss counted as layers."""
    stage = rank // (ctx.tp * ctx.cp) % ctx.pp
    slots = [chunk_slots(ctx, stage, c) for c in range(ctx.vp)]
    return 2 * ctx.microbatches * sum(n + e + lo for n, e, lo in slots)


def rows(before: str, after: str) -> list[tuple[str, tuple, int, int, float]]:
    """(layout name, (tp, pp, vp, microbatches, mbs), passes, tokens, median host s) of every
    2-rank FP32 layout of the runs named from `after` (inclusive) to `before`, one per layout."""
    skip = unseen()
    got: dict[tuple, list] = defaultdict(list)
    for lay in sorted(PROOF.glob("*/layouts/*")):
        run = lay.parent.parent.name
        rounds = sorted(p for p in lay.glob("r*") if (p / "analysis.json").is_file())
        if (not rounds or not (lay / "config.toml").is_file() or run_time(run) >= before
                or run_time(run) < after or (not run.startswith("extra_") and lay.name in skip)):
            continue
        man = json.loads((rounds[0] / "profile.json").read_text())
        if man["world_size"] != 2 or man["precision"] != "fp32":
            continue
        ctx = Context.of(load_config(lay / "config.toml"))
        hosts, rank = [], 0
        for r in rounds:
            a = json.loads((r / "analysis.json").read_text())
            parts = {c["component"]: c["measured_s"] for c in a["comparison"]}
            hosts.append(parts.get("host gaps", 0.0) + parts.get("other comm exposed", 0.0))
            rank = a["compared_ranks"][0]
        key = (ctx.tp, ctx.pp, ctx.vp, ctx.microbatches, ctx.mbs)
        got[key].append((lay.name, passes(ctx, rank), ctx.tokens, statistics.median(hosts)))
    return [(v[0][0], key, v[0][1], v[0][2], statistics.median(x[3] for x in v))
            for key, v in sorted(got.items())]


def fit(data: list[tuple[str, tuple, int, int, float]]) -> tuple[float, float, float, np.ndarray]:
    """(F, h, b) in seconds by least squares over `rows`' layouts, and each layout's fitted host."""
    n = np.array([p for _, _, p, _, _ in data], float)
    tokens = np.array([t for _, _, _, t, _ in data], float)
    y = np.array([h for *_, h in data])
    design = np.stack([np.ones_like(n), n, n * tokens], axis=1)
    (f, h, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(f), float(h), float(b), design @ np.array([f, h, b])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--after", default="2026-12-06T2130Z",
                    help="fit the runs named from this UTC time on (default: the AVX512 machine "
                         "of the fourth proof file's, the committed priors')")
    ap.add_argument("--before", default="2026-12-07T1030Z",
                    help="and before this one (default: the committed priors')")
    a = ap.parse_args()
    data = rows(a.before, a.after)
    if len({(p, t) for _, _, p, t, _ in data}) < 3:
        raise SystemExit(f"under three distinct (passes, tokens) in {PROOF} from {a.after} to "
                         f"{a.before}: the fit needs three")
    f, h, b, fitted = fit(data)
    print(f"{len(data)} layouts of runs from {a.after} to {a.before} (2 ranks, FP32; "
          "(tp, pp, vp, microbatches, mbs)):")
    for (name, key, n, t, got), pred in zip(data, fitted):
        print(f"  {name:14s} {str(key):18s} {n:3d} passes of {t:5d} tokens: {got * 1e3:6.1f} ms, "
              f"fit {pred * 1e3:6.1f} ({got / pred:.2f})")
    print(f"F (per step) {f * 1e3:.2f} ms; h (per layer pass) {h * 1e3:.3f} ms; "
          f"b (per pass and token) {b * 1e9:.0f} ns")
    print(f"systems/cpu.toml: host_s_per_step = {f - ASSUMED.host_step_overhead_s:.4f}, "
          f"host_s_per_layer_token = {b:.2g}")


if __name__ == "__main__":
    main()
