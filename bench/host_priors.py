"""The CPU's host-time priors (systems/cpu.toml `host_s_per_step`, `host_s_per_layer_token`),
fitted from the committed 2-rank DP profiles of the planner's proof (docs/planner.md, "Model
revision 13").

A profile's host time (host gaps + other communication exposed, what the calibration reads as
`host_s`) is fitted, by least squares over every committed 2-rank DP layout without TP or PP
(FP32, the tiny model: no rank waits for a core, no TP function waits for a collective), as

    host = F + passes x (h + b x sequences per microbatch)

F the host time per step outside the layer passes (the optimizer's Python, the step's own
calls), h the time per layer pass, b its growth per sequence of the microbatch; passes = the
microbatches x (layers + embedding + loss) x 2, as the planner counts them (`costs.chunk_cost`).
The layouts vary the microbatch (1, 2, 4) and the microbatches per step (1, 2), so the three are
separate. Each layout of a run counts once (its rounds' median).

F holds the world group's few small collectives of the step's end ("other comm exposed", some
2 ms), which the planner also prices in the optimizer's time: a calibration's fixed part per
pass absorbs the difference. The planner takes F less its own assumed host work per step
(`Assumed.host_step_overhead_s`, added on every system) as `host_s_per_step` and b per token
(b / sequence length) as
`host_s_per_layer_token`; h is what a calibration fits (`host_s_per_layer_pass`). The committed
priors come from the runs before `--before` (default: the folders that existed when they were
set); later runs change the fit, which this script shows. Never part of `make test`.

    PYTHONPATH=. .venv/bin/python bench/host_priors.py [--before 2026-12-06T1400Z] [--after T]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from llama31_405b.planner.calibrate.constants import ASSUMED

ROOT = Path(__file__).resolve().parents[1]
PROOF = ROOT / "docs" / "planner_proof"
LAYERS, SEQUENCE = 4, 256  # configs/tiny_cpu.toml


def run_time(folder: str) -> str:
    """The UTC date and time a run or extra folder is named by (`2026-12-05T1200Z`)."""
    return folder.removeprefix("extra_")[:16]


def rows(before: str, after: str = "") -> list[tuple[str, str, int, int, float]]:
    """(run, layout, mbs, microbatches, median host s) of every 2-rank FP32 DP layout of the
    runs named from `after` (inclusive) to `before`."""
    out = []
    for lay in sorted(PROOF.glob("*/layouts/*")):
        run = lay.parent.parent.name
        rounds = sorted(p for p in lay.glob("r*") if (p / "analysis.json").is_file())
        if not rounds or run_time(run) >= before or run_time(run) < after:
            continue
        man = json.loads((rounds[0] / "profile.json").read_text())
        par, batch = man["layout"], man["batch"]
        if (man["world_size"] != 2 or man["precision"] != "fp32" or par["tp"] != 1
                or par["pp"] != 1 or par.get("cp", 1) != 1):
            continue
        hosts = []
        for r in rounds:
            got = {c["component"]: c["measured_s"]
                   for c in json.loads((r / "analysis.json").read_text())["comparison"]}
            hosts.append(got.get("host gaps", 0.0) + got.get("other comm exposed", 0.0))
        mbs = batch["mbs"]
        out.append((run, lay.name, mbs, batch["minibs"] // mbs, statistics.median(hosts)))
    return out


def fit(data: list[tuple[str, str, int, int, float]]) -> tuple[float, float, float, np.ndarray]:
    """(F, h, b) in seconds by least squares over `rows`' layouts, and each layout's fitted host."""
    passes = np.array([n * (LAYERS + 2) * 2 for _, _, _, n, _ in data], float)
    mbs = np.array([m for _, _, m, _, _ in data], float)
    y = np.array([h for *_, h in data])
    design = np.stack([np.ones_like(passes), passes, passes * mbs], axis=1)
    (f, h, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(f), float(h), float(b), design @ np.array([f, h, b])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="2026-12-06T1400Z",
                    help="fit the runs named before this UTC time (default: the committed priors')")
    ap.add_argument("--after", default="",
                    help="and from this UTC time on (one machine's runs: 2026-12-06T2130Z for the "
                         "AVX512 machine of the fourth proof file's)")
    a = ap.parse_args()
    data = rows(a.before, a.after)
    if len({(m, n) for _, _, m, n, _ in data}) < 3:
        raise SystemExit(f"under three distinct (mbs, microbatches) in {PROOF} from "
                         f"{a.after or 'the first'} to {a.before}: the fit needs three")
    f, h, b, fitted = fit(data)
    print(f"{len(data)} layouts of runs from {a.after or 'the first'} to {a.before} "
          "(2 ranks, DP, FP32):")
    for (run, name, m, n, got), pred in zip(data, fitted):
        print(f"  {run:28s} {name:8s} mbs {m} x {n}: {got * 1e3:6.1f} ms, fit {pred * 1e3:6.1f}")
    print(f"F (per step) {f * 1e3:.2f} ms; h (per layer pass) {h * 1e3:.3f} ms; "
          f"b (per pass and sequence) {b * 1e3:.3f} ms")
    print(f"systems/cpu.toml: host_s_per_step = {f - ASSUMED.host_step_overhead_s:.4f}, "
          f"host_s_per_layer_token = {b / SEQUENCE:.3g}")


if __name__ == "__main__":
    main()
