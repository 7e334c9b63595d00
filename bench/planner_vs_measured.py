"""The planner calibrated from one measured profile, against layouts it did not see (issue 39).

Profiles the tiny model at 4 gloo ranks (`python -m llama31_405b profile` under torchrun) at one
layout, calibrates the planner from it (`plan --calibrate`), then profiles the other layouts in
the same run and prints, per layout, the predicted and measured step and its main components
(compute, exposed TP, PP with the bubble, DP, host time with the other communication) as
measured / predicted ratios, and whether the layouts rank as measured:

    PYTHONPATH=$PWD .venv/bin/python bench/planner_vs_measured.py [--fit tp2pp2] [--steps 3]
        [--work DIR] [--reuse] [--json]

Layouts: dp4 (DP 4), pp2dp2 (PP 2 x DP 2), pp2dp2vp2 (PP 2 x VP 2 x DP 2), tp2pp2, tp2dp2, and
gb200 (configs/tiny_cpu_gb200.toml: PP 2 x VP 2 x DP 2 with the GB200 settings: NVFP4 emulation,
BF16 parameters and attention, overlapped DP, 6 layers). The first run writes the tiny data and
both initial checkpoints into --work (a few minutes); --reuse analyses the profile folders a
previous run left there instead of profiling again. On a shared machine the figures move with
its load: the load average is printed before and after. Never part of `make test`.
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

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
TINY = "[parallel]\ntp = {tp}\npp = {pp}\nvp = {vp}\n\n[batch]\nminibs = {minibs}\nmicro_batch_size = {mbs}\n"
LAYOUTS = {
    "dp4": ("tiny", TINY.format(tp=1, pp=1, vp=1, minibs=2, mbs=1)),
    "pp2dp2": ("tiny", TINY.format(tp=1, pp=2, vp=1, minibs=4, mbs=1)),
    "pp2dp2vp2": ("tiny", TINY.format(tp=1, pp=2, vp=2, minibs=4, mbs=1)),
    "tp2pp2": ("tiny", TINY.format(tp=2, pp=2, vp=1, minibs=8, mbs=2)),
    "tp2dp2": ("tiny", TINY.format(tp=2, pp=1, vp=1, minibs=4, mbs=1)),
    "gb200": ("gb200", ""),
}
COLUMNS = (("step", ("step",)), ("compute", ("compute",)), ("TP", ("TP",)), ("PP+bubble", ("PP",)),
           ("DP", ("DP",)), ("host+other", ("host",)))


def _run(cmd: list[str], log: Path) -> None:
    with log.open("w") as f:
        r = subprocess.run(cmd, cwd=ROOT, env=ENV, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{log.read_text()[-3000:]}")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(work: Path) -> None:
    """Tiny data and the two initial checkpoints (tiny_cpu's, tiny_cpu_gb200's) in `work`."""
    for name, base in (("tiny", "tiny_cpu.toml"), ("gb200", "tiny_cpu_gb200.toml")):
        (work / f"base_{name}.toml").write_text(
            f'base = "{ROOT / "configs" / base}"\n\n[data]\ndata_dir = "{work / "data"}"\n\n'
            f'[checkpoint]\nckpt_dir = "{work / "ckpt"}"\n')
    if (work / "ckpt" / "tiny-init").exists() and (work / "ckpt" / "tiny-gb200-init").exists():
        return
    sys.path.insert(0, str(ROOT))
    from llama31_405b.data.tiny import ensure_tiny_data
    ensure_tiny_data(work / "data")
    py = [sys.executable, "-m"]
    _run([*py, "llama31_405b", "train-init", "--config", str(work / "base_tiny.toml")],
         work / "init.log")
    _run([*py, "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m", "llama31_405b",
          "train-init", "--config", str(work / "base_gb200.toml")], work / "init_gb200.log")


def config(work: Path, name: str) -> Path:
    base, block = LAYOUTS[name]
    path = work / f"{name}.toml"
    path.write_text(f'base = "{work}/base_{base}.toml"\n\n{block}\n[system]\ngpus_per_rack = 4\n'
                    if block else f'base = "{work}/base_{base}.toml"\n')
    return path


def profile(work: Path, name: str, steps: int) -> Path:
    out = work / f"profile_{name}"
    if out.exists():
        sys.exit(f"{out} exists: a profile folder is never overwritten (use another --work, or "
                 "--reuse to analyse it)")
    t0 = time.perf_counter()
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4",
          f"--master_port={_port()}", "--master_addr=127.0.0.1", "-m", "llama31_405b", "profile",
          str(config(work, name)), "--out", str(out), "--ranks", "all", "--skip", "1",
          "--baseline", "1", "--steps", str(steps)], work / f"profile_{name}.log")
    print(f"  profiled {name} in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def measured(folder: Path) -> dict:
    a = json.loads((folder / "analysis.json").read_text())
    rows = {r["component"]: r["measured_s"] for r in a["comparison"]}
    comp = sum(v for k, v in rows.items() if k.startswith(("GEMM", "attention", "other compute")))
    return {"step": a["measured_step_s"], "compute": comp, "TP": rows["TP exposed"],
            "PP": rows["PP exposed (incl. bubble)"], "DP": rows["DP exposed"],
            "host": rows["host gaps"] + rows["other comm exposed"] + rows["optimizer"],
            "overhead_ratio": a.get("overhead_ratio")}


def predicted(cfg_path: Path, fit) -> dict:
    from llama31_405b.config.load import load_config
    from llama31_405b.planner import predict
    b = predict(load_config(cfg_path), fit).breakdown
    return {"step": sum(b[k] for k in ("compute_total_s", "tp_s", "cp_s", "pp_s", "bubble_s",
                                       "dp_s", "optimizer_s", "host_s")),
            "compute": b["compute_total_s"], "TP": b["tp_s"], "PP": b["pp_s"] + b["bubble_s"],
            "DP": b["dp_s"], "host": b["host_s"] + b["optimizer_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fit", default="tp2pp2", choices=sorted(LAYOUTS), help="the layout calibrated on")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps per layout (default 3)")
    ap.add_argument("--work", type=Path, help="work folder (default: a new temporary one)")
    ap.add_argument("--reuse", action="store_true", help="analyse the profiles already in --work")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    work = a.work or Path(tempfile.mkdtemp(prefix="planner_vs_measured_"))
    work.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    print(f"work folder {work}; load average {load0[0]:.1f} on {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    setup(work)
    names = [a.fit] + [n for n in LAYOUTS if n != a.fit]
    folders = {n: work / f"profile_{n}" for n in names}
    if not a.reuse:
        for n in names:
            profile(work, n, a.steps)
    cal = work / f"calibration_{a.fit}_{time.strftime('%H%M%S')}.toml"
    _run([sys.executable, "-m", "llama31_405b", "plan", "--calibrate", str(folders[a.fit]),
          "--calibration-out", str(cal), "--config", str(config(work, a.fit))], work / "calibrate.log")
    from llama31_405b.planner import calibrated
    fit = calibrated.read(cal).fit
    rows = {n: (measured(folders[n]), predicted(config(work, n), fit)) for n in names}
    load1 = os.getloadavg()
    if a.json:
        print(json.dumps({"fit": a.fit, "calibration": str(cal), "load": [load0, load1],
                          "rows": rows}, indent=1))
        return
    print(f"\ncalibrated on {a.fit} ({cal}); measured / predicted (predicted ms in brackets):")
    print(f"{'layout':<11}" + "".join(f"{c:>20}" for c, _ in COLUMNS) + f"{'prof. ovh':>10}")
    for n in names:
        m, p = rows[n]
        cells = []
        for _, (k,) in COLUMNS:
            r = f"{m[k] / p[k]:.2f}" if p[k] > 1e-4 else ("-" if m[k] < 1e-3 else "inf")
            cells.append(f"{r} ({p[k] * 1e3:.0f})")
        tag = " (fit)" if n == a.fit else ""
        ovh = m["overhead_ratio"]
        print(f"{n + tag:<11}" + "".join(f"{c:>20}" for c in cells)
              + f"{(f'{ovh:.2f}' if ovh else '-'):>10}")
    others = [n for n in names if n != a.fit]
    by_m = sorted(others, key=lambda n: rows[n][0]["step"])
    by_p = sorted(others, key=lambda n: rows[n][1]["step"])
    within = sum(abs(rows[n][0]["step"] / rows[n][1]["step"] - 1) <= 0.15 for n in others)
    print(f"\nsteps within 15%: {within} of {len(others)}; ranked by measured step: "
          f"{' < '.join(by_m)}; by predicted: {' < '.join(by_p)} "
          f"({'same order' if by_m == by_p else 'different order'})")
    print(f"load average {load0[0]:.1f} before, {load1[0]:.1f} after")


if __name__ == "__main__":
    main()
