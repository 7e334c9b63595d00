"""The planner calibrated from one measured profile, against layouts it did not see (issue 39).

Profiles the tiny model at 4 gloo ranks (`python -m llama31_405b profile` under torchrun) in six
layouts, in --rounds rounds (each round profiles the fit layout first, then the others, in
reverse order every other round, so that a drift of the machine meets every layout alike).
It calibrates the planner once on the fit layout's profiles of every round (`plan --calibrate
DIR...`: the median of each measured figure) and predicts every layout with it; the table
holds, per layout, the median over the rounds of the measured step and its main components (compute,
exposed TP, PP with the bubble, DP, host time with the other communication and the optimizer)
against the prediction as measured / predicted ratios, each round's step ratio, the load average while it was profiled, how many steps are
within 15% and whether the layouts rank as measured. It prints the table as markdown, ready for
docs/planner.md:

    PYTHONPATH=$PWD .venv/bin/python bench/planner_vs_measured.py [--fit tp2dp2] [--steps 4]
        [--rounds 2] [--work DIR] [--reuse] [--json]

Layouts: dp4 (DP 4), pp2dp2 (PP 2 x DP 2), pp2dp2vp2 (PP 2 x VP 2 x DP 2), tp2pp2, tp2dp2, and
gb200 (configs/tiny_cpu_gb200.toml: PP 2 x VP 2 x DP 2 with the GB200 settings: NVFP4 emulation,
BF16 parameters and attention, overlapped DP, 6 layers). The first run writes the tiny data and
both initial checkpoints into --work (a few minutes); --reuse analyses the profile folders a
previous run left there instead of profiling again (a new calibration each time; nothing is
overwritten). On a shared machine the figures move with its load: the 1-minute load average is
recorded before and after every profile (loads.json) and printed per layout. Never part of
`make test`.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
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
COLUMNS = (("step", "step"), ("compute", "compute"), ("TP exposed", "TP"), ("PP + bubble", "PP"),
           ("DP exposed", "DP"), ("host + other + optimizer", "host"))
LABELS = {"dp4": "DP4", "pp2dp2": "PP2 x DP2", "pp2dp2vp2": "PP2 x VP2 x DP2", "tp2pp2": "TP2 x PP2",
          "tp2dp2": "TP2 x DP2", "gb200": "tiny_cpu_gb200 (PP2 x VP2 x DP2, GB200 settings)"}


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


def profile(work: Path, name: str, rnd: int, steps: int, loads: dict) -> Path:
    out = work / f"profile_{name}_r{rnd}"
    if out.exists():
        sys.exit(f"{out} exists: a profile folder is never overwritten (use another --work, or "
                 "--reuse to analyse it)")
    t0, l0 = time.perf_counter(), os.getloadavg()[0]
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4",
          f"--master_port={_port()}", "--master_addr=127.0.0.1", "-m", "llama31_405b", "profile",
          str(config(work, name)), "--out", str(out), "--ranks", "all", "--skip", "1",
          "--baseline", "1", "--steps", str(steps)], work / f"profile_{name}_r{rnd}.log")
    l1 = os.getloadavg()[0]
    loads[out.name] = [l0, l1]
    (work / "loads.json").write_text(json.dumps(loads, indent=1))
    print(f"  round {rnd}: profiled {name} in {time.perf_counter() - t0:.0f} s (load average "
          f"{l0:.1f} -> {l1:.1f})", flush=True)
    return out


def measured(folder: Path) -> dict:
    a = json.loads((folder / "analysis.json").read_text())
    rows = {r["component"]: r["measured_s"] for r in a["comparison"]}
    comp = sum(v for k, v in rows.items() if k.startswith(("GEMM", "attention", "other compute")))
    return {"step": a["measured_step_s"], "compute": comp, "TP": rows["TP exposed"],
            "PP": rows["PP exposed (incl. bubble)"], "DP": rows["DP exposed"],
            "host": rows["host gaps"] + rows["other comm exposed"] + rows["optimizer"],
            "overhead_ratio": a.get("overhead_ratio") or 0.0}


def predicted(cfg_path: Path, fit) -> dict:
    from llama31_405b.config.load import load_config
    from llama31_405b.planner import predict
    b = predict(load_config(cfg_path), fit).breakdown
    return {"step": sum(b[k] for k in ("compute_total_s", "tp_s", "cp_s", "pp_s", "bubble_s",
                                       "dp_s", "optimizer_s", "host_s")),
            "compute": b["compute_total_s"], "TP": b["tp_s"], "PP": b["pp_s"] + b["bubble_s"],
            "DP": b["dp_s"], "host": b["host_s"] + b["optimizer_s"]}


def order(names: list[str], fit: str, rnd: int) -> list[str]:
    """The fit layout first in every round, the others forward in odd rounds, reversed in even."""
    others = [n for n in names if n != fit]
    return [fit] + (others if rnd % 2 else others[::-1])


def median(values: list[dict]) -> dict:
    return {k: statistics.median(v[k] for v in values) for k in values[0]}


def _cell(m: float, p: float) -> str:
    """measured / predicted (predicted ms); a part the model gives no time: what was measured."""
    if p > 1e-4:
        return f"{m / p:.2f} ({p * 1e3:.0f})"
    return "-" if m < 1e-3 else f"- ({m * 1e3:.0f} measured)"


def table(fit: str, names: list[str], rows: dict, loads: dict, rounds: int) -> str:
    """The markdown table and the verdict lines (docs/planner.md, "Proof on CPU")."""
    head = ["layout", *(c for c, _ in COLUMNS), "step per round", "load avg", "prof. ovh"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    med = {}
    for n in names:
        m, p = median([r[0] for r in rows[n]]), median([r[1] for r in rows[n]])
        med[n] = (m, p)
        cells = [_cell(m[k], p[k]) for _, k in COLUMNS]
        if n != fit:
            cells[0] = f"**{cells[0].split()[0]}** {cells[0].split()[1]}"
        per = ", ".join(f"{a['step'] / b['step']:.2f}" for a, b in rows[n])
        ld = [x for r in range(1, rounds + 1) for x in loads.get(f"profile_{n}_r{r}", [])]
        load = f"{min(ld):.1f}-{max(ld):.1f}" if ld else "-"
        label = LABELS[n] + (" (fit)" if n == fit else "")
        out.append("| " + " | ".join([label, *cells, per, load, f"{m['overhead_ratio']:.2f}"]) + " |")
    others = [n for n in names if n != fit]
    by_m = sorted(others, key=lambda n: med[n][0]["step"])
    by_p = sorted(others, key=lambda n: med[n][1]["step"])
    within = sum(abs(med[n][0]["step"] / med[n][1]["step"] - 1) <= 0.15 for n in others)
    out += ["", f"Steps within 15%: {within} of {len(others)} (goal: all). Ranked by measured step: "
            f"{' < '.join(by_m)}; by predicted: {' < '.join(by_p)} "
            f"({'the measured order' if by_m == by_p else 'not the measured order'})."]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fit", default="tp2dp2", choices=sorted(LAYOUTS), help="the layout calibrated on")
    ap.add_argument("--steps", type=int, default=4, help="profiled steps per layout (default 4)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of all layouts (default 2)")
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
    lpath = work / "loads.json"
    loads = json.loads(lpath.read_text()) if lpath.exists() else {}
    if not a.reuse:
        for r in range(1, a.rounds + 1):
            for n in order(names, a.fit, r):
                profile(work, n, r, a.steps, loads)
    from llama31_405b.planner import calibrate
    folders = {n: [work / f"profile_{n}_r{r}" for r in range(1, a.rounds + 1)] for n in names}
    missing = [str(f) for fs in folders.values() for f in fs if not (f / "analysis.json").is_file()]
    if missing:
        sys.exit(f"no profile {missing[0]} (run without --reuse, or fewer --rounds)")
    cal = work / f"calibration_{a.fit}_{time.strftime('%H%M%S')}.toml"
    _run([sys.executable, "-m", "llama31_405b", "plan", "--calibrate", *map(str, folders[a.fit]),
          "--calibration-out", str(cal), "--config", str(config(work, a.fit))],
         work / f"calibrate_{cal.stem}.log")
    fit = calibrate.read(cal).fit
    rows: dict[str, list] = {}
    for n in names:
        p = predicted(config(work, n), fit)
        rows[n] = [(measured(f), p) for f in folders[n]]
    load1 = os.getloadavg()
    if a.json:
        print(json.dumps({"fit": a.fit, "calibration": str(cal), "load": [load0, load1],
                          "loads": loads, "rows": rows}, indent=1))
        return
    print(f"\ncalibrated on the median of {a.fit}'s {a.rounds} profiles ({cal}); per layout the "
          "median over the rounds, measured / predicted (predicted ms in brackets), each round's "
          "step ratio, the load average while the layout was profiled:\n")
    print(table(a.fit, names, rows, loads, a.rounds))
    print(f"Load average {load0[0]:.1f} before, {load1[0]:.1f} after "
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs).")


if __name__ == "__main__":
    main()
