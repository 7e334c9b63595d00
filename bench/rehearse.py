"""Wall time and peak memory of a rehearsal of the 128-rack GB200 config (8,192 ranks).

Runs `python -m llama31_405b rehearse CONFIG --json` (default ranks: one per pipeline stage) and
prints, per rank process, its wall time, its init phases and its peak RSS, then the dataset
process and the whole rehearsal's wall time, beside the goal (2 minutes and 4 GB per rank on a
2-core machine). The figures depend on the machine's load: say how loaded it was when quoting
them (`uptime` is printed first).

    PYTHONPATH=$PWD .venv/bin/python bench/rehearse.py [--config PATH] [--jobs N] [--ranks LIST]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S, GOAL_GB = 120.0, 4.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config",
                    default=str(ROOT / "configs" / "config_GB200_2048x4x8xtp4pp8cp2.toml"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--ranks", default=None)
    a = ap.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPU(s), load average {load[0]:.1f} / {load[1]:.1f} / "
          f"{load[2]:.1f} (1 / 5 / 15 min)")
    cmd = [sys.executable, "-m", "llama31_405b", "rehearse", a.config, "--json", "--jobs",
           str(a.jobs)] + (["--ranks", a.ranks] if a.ranks else [])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if not r.stdout.strip().startswith("{"):
        print(r.stdout[-3000:], r.stderr[-3000:], sep="\n")
        return 1
    rep = json.loads(r.stdout)
    print(f"rehearsal of {Path(a.config).name}: world {rep['world_size']}, "
          f"{len(rep['ranks'])} rank process(es), {a.jobs} at a time: {wall:.0f} s wall, "
          f"verdict {'PASS' if rep['ok'] else 'FAIL'} (exit {r.returncode})")
    print(f"{'rank':>6} {'stage':>6} {'wall s':>7} {'peak RSS GB':>12} {'wall/goal':>10} "
          f"{'RSS/goal':>9}  phases (s)")
    worst_s = worst_gb = 0.0
    for res in rep["ranks"]:
        s, gb = res.get("wall_s", 0.0), res.get("peak_rss", 0) / 1e9
        worst_s, worst_gb = max(worst_s, s), max(worst_gb, gb)
        phases = " ".join(f"{k}={v:.1f}" for k, v in res.get("phases", {}).items())
        print(f"{res['rank']:>6} {res['planner']['stage']:>6} {s:>7.1f} {gb:>12.2f} "
              f"{s / GOAL_S:>10.2f} {gb / GOAL_GB:>9.2f}  {phases}")
    ds = rep.get("dataset") or {}
    if ds.get("build_s") is not None:
        print(f"dataset index: {ds['total_bytes'] / 1e9:.2f} GB, build {ds['build_s']:.0f} s "
              f"({ds['build_how']}), rank 0 peak ~{ds['peak_build_bytes'] / 1e9:.1f} GB at full "
              f"size; the dataset process here: {ds.get('wall_s', 0):.0f} s, peak RSS "
              f"{ds.get('peak_rss', 0) / 1e9:.2f} GB")
    print(f"worst rank: {worst_s:.0f} s ({worst_s / GOAL_S:.2f} of the {GOAL_S:.0f} s goal), "
          f"{worst_gb:.2f} GB ({worst_gb / GOAL_GB:.2f} of the {GOAL_GB:.0f} GB goal)")
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
