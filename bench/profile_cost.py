"""What `profile` costs: the analysis time of an 8-rank, 3-step CPU profile, the trace size per
rank per step, and the profiler's overhead on the tiny run (profiled / unprofiled step time,
both measured in the same run by the command itself).

Runs `python -m llama31_405b profile` on the tiny model at 8 gloo ranks (TP2 x PP2 x DP2,
`--ranks all --steps 3`) under torchrun, unless --folder names an existing profile folder; then
times `analyze_folder` (--repeat times, the median printed) in this process. Prints the machine's
load average next to the figures: on a shared machine they are inflated.

    PYTHONPATH=$PWD .venv/bin/python bench/profile_cost.py --config TINY.toml [--folder DIR]

TINY.toml: a tiny config whose data and initial checkpoint exist (e.g. the tests' tiny_env
config, or configs/tiny_cpu.toml after `python -m llama31_405b train-init`).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = "[parallel]\ntp = 2\npp = 2\n\n[system]\ngpus_per_rack = 8\n\n[batch]\nminibs = 4\n" \
         "micro_batch_size = 1\n"


def run_profile(config: Path, out: Path) -> float:
    cfg = out.parent / "bench_profile.toml"
    cfg.write_text(f'base = "{config.resolve()}"\n\n{LAYOUT}')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=8",
                        f"--master_port={port}", "--master_addr=127.0.0.1", "-m", "llama31_405b",
                        "profile", str(cfg), "--out", str(out), "--ranks", "all", "--skip", "2",
                        "--baseline", "3", "--steps", "3"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"profile failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, help="tiny config with data and initial checkpoint")
    ap.add_argument("--folder", type=Path, help="analyse this profile folder instead of running")
    ap.add_argument("--out", type=Path, help="keep the profile folder of the run here")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from llama31_405b.profile.report import analyze_folder
    tmp = None
    if a.folder is None:
        if a.config is None:
            ap.error("--config or --folder")
        if a.out is None:
            tmp = tempfile.TemporaryDirectory(prefix="profile_cost_")
            a.out = Path(tmp.name) / "out"
        a.folder = a.out
        a.folder.parent.mkdir(parents=True, exist_ok=True)
        wall = run_profile(a.config, a.folder)
        print(f"profile run (8 ranks, 2 skipped + 3 timed + 3 profiled steps): {wall:.0f} s")
    times, cpu = [], []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        res = analyze_folder(a.folder)
        times.append(time.perf_counter() - t0)
        c0 = time.process_time()   # one process: its CPU time is what an idle core would take
        analyze_folder(a.folder, workers=1)
        cpu.append(time.process_time() - c0)
    records = [json.loads(p.read_text()) for p in (a.folder / "ranks").glob("rank*.json")]
    steps = max(len(r["profiled_step_s"]) for r in records)
    print(f"analysis of {len(res['ranks'])} ranks x {steps} steps: wall median {median(times):.2f} s "
          f"of {a.repeat} (min {min(times):.2f}, max {max(times):.2f}); CPU time in one process "
          f"median {median(cpu):.2f} s (min {min(cpu):.2f})")
    print(f"trace size per rank per step: {res['trace_bytes_per_rank_per_step'] / 1e6:.2f} MB "
          "(gzipped Chrome JSON)")
    ratios = sorted(r["overhead_ratio"] for r in records if r.get("overhead_ratio"))
    if ratios:
        print(f"profiler overhead (profiled / unprofiled step, per rank): median "
              f"{median(ratios):.2f}, range {ratios[0]:.2f}-{ratios[-1]:.2f}")
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} CPUs")
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
