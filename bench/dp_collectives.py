"""The DP collectives of CPU profiles, one by one: what each of megatron-core's gloo
reduce-scatters and all-gathers took in training, and whether its rank was computing meanwhile.

The planner prices a DP collective by a latency and its bytes (plus a fixed time where ranks
share cores, model revision 15); a profile's analysis gives the DP group's total and exposed
time per step. Neither says what one bucket's collective costs while the rank computes, which
is what the GB200 settings' overlapped buckets run into (docs/planner.md, "What the tenth set
shows about DP on the GB200 settings"). This reads the traces a profile keeps
(`traces/rank<R>.trace.json.gz` with its `.meta.json`: the main thread and each group's worker
threads, profile/capture.py) and prints, per profile and rank, the DP group's collectives per
step by gloo operation and by regime: "computing" where the rank's main thread ran its model or
optimizer (a `role:`, `autograd::engine` or `profile:` event) for more than half the collective,
else "waiting". A gloo collective's event spans from its worker thread taking it to the data's
arrival, so it holds the wait for a late peer.

    PYTHONPATH=$PWD .venv/bin/python bench/dp_collectives.py FOLDER... [--out FILE.json]

FOLDER: a profile folder (`profile --out`), or a bench work folder whose profile_<layout>_r<k>
folders are read in turn. Never part of `make test`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from llama31_405b.profile.intervals import intersect, measure, union  # noqa: E402
from llama31_405b.profile.trace import load  # noqa: E402

BUSY = ("role:", "autograd::engine", "profile:")
"""Main-thread events during which the rank computes (the model's modules, the backward's
nodes, the loss and the optimizer)."""


def profiles(folder: Path) -> list[Path]:
    if (folder / "traces").is_dir():
        return [folder]
    return sorted(p for p in folder.glob("profile_*_r*") if (p / "traces").is_dir())


def rank_collectives(trace_path: Path) -> dict:
    """One rank's DP collectives within its profiled steps: {"steps": n, "ops": {"<op>/<regime>":
    [ms, ...]}}."""
    meta = json.loads(trace_path.with_name(trace_path.name.replace(".trace.json.gz",
                                                                    ".meta.json")).read_text())
    tr = load(trace_path)
    main = meta["main_tid"]
    dp = {t for g in meta["groups"] if g["role"] == "DP" for t in g["tids"]}
    steps = sorted((e for e in tr.events if e.name.startswith("profile_step#")),
                   key=lambda e: e.ts)
    lo, hi = steps[0].ts, steps[-1].end
    busy = union((e.ts, e.end) for e in tr.events
                 if e.tid == main and e.name.startswith(BUSY))
    ops: dict[str, list[float]] = {}
    for e in tr.events:
        if e.tid in dp and e.name.startswith("gloo:") and lo <= e.ts <= hi and e.dur > 0:
            share = measure(intersect([(e.ts, e.end)], busy)) / e.dur
            key = f"{e.name.split(':', 1)[1]}/{'computing' if share > 0.5 else 'waiting'}"
            ops.setdefault(key, []).append(e.dur / 1e3)
    return {"steps": len(steps), "ops": ops}


def summarise(got: dict) -> dict:
    n = got["steps"]
    return {k: {"per_step": len(v) / n, "mean_ms": statistics.fmean(v),
                "median_ms": statistics.median(v), "ms_per_step": sum(v) / n}
            for k, v in sorted(got["ops"].items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, help="also write the figures as JSON here")
    a = ap.parse_args(argv)
    out: dict[str, dict] = {}
    for folder in a.folders:
        for prof in profiles(folder):
            for tp in sorted((prof / "traces").glob("rank*.trace.json.gz")):
                rank = int(tp.name[4:9])
                s = summarise(rank_collectives(tp))
                out.setdefault(prof.name, {})[str(rank)] = s
                total = sum(x["ms_per_step"] for x in s.values())
                cells = "; ".join(f"{k} {x['per_step']:.1f}/step, mean {x['mean_ms']:.2f} "
                                  f"median {x['median_ms']:.2f} ms" for k, x in s.items())
                print(f"{prof.name} rank {rank}: {total:.1f} ms a step; {cells}", flush=True)
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
