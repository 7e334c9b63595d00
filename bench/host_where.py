"""Where a CPU profile's host time goes: every piece of host gap (no compute, no collective:
profile/analysis.py's partition) given to the innermost training-thread op that holds it, or to
the innermost annotation (a module's role, the step) where no op does; per rank, ms per step.

The planner prices host time per layer pass and per step (planner/costs.py `host_pass_s`,
systems `host_s_per_step`); this says what the profile's host time is made of, so that a model of
it can be checked against its parts: the autograd Functions' own Python (the emulated NVFP4
linears', megatron-core's TP regions'), the collectives' calls (`c10d::*`: their own time where no
gloo event runs, e.g. the caller waking after the collective ended), the Python between ops.

    PYTHONPATH=$PWD .venv/bin/python bench/host_where.py PROFILE_FOLDER... [--top 8] [--json F]

A PROFILE_FOLDER is a `profile` output (traces/ with each rank's trace and sidecar); a bench work
folder's `profile_<layout>_r<k>` are such folders. Reads traces only, runs nothing; seconds per
rank. Never part of `make test`.
"""
from __future__ import annotations

import argparse
import json
from bisect import bisect_left
from pathlib import Path

from llama31_405b.profile import trace as tr
from llama31_405b.profile.analysis import RankAnalysis

OUTSIDE = "(no op: Python between ops)"


def host_pieces(ra: RankAnalysis) -> list[list[tuple[float, float]]]:
    """Per step window, the host-gap pieces (µs) of the analysis' partition."""
    return [st.host_pieces for st in ra.steps]


def _key(name: str) -> str:
    """An op's name as reported (autograd's node names shortened)."""
    prefix = "autograd::engine::evaluate_function: "
    return "evaluate_function: " + name[len(prefix):] if name.startswith(prefix) else name


def holders(events, pieces: list[tuple[float, float]]) -> dict[str, float]:
    """µs of `pieces` by holder: each piece cut at the main-thread events' starts and ends, each
    part given to the innermost event covering it (the latest started)."""
    evs = sorted((e for e in events if not e.name.startswith("gloo:")),
                 key=lambda e: (e.ts, -e.dur))
    cuts = sorted({t for x in evs for t in (x.ts, x.end)})
    subs = []   # each piece cut at every event's start and end: one holder per sub-piece
    for s, e in pieces:
        inner = cuts[bisect_left(cuts, s):bisect_left(cuts, e)]
        edges = [s, *(t for t in inner if t > s), e]
        subs.extend(zip(edges, edges[1:]))
    out: dict[str, float] = {}
    i, stack = 0, []
    for s, e in sorted(subs):
        mid = (s + e) / 2
        while i < len(evs) and evs[i].ts <= mid:
            stack.append(evs[i])
            i += 1
        stack = [x for x in stack if x.end > mid]
        ops = [x for x in stack if x.cat == "cpu_op"]
        where = stack[-1].name.split("#")[0] if stack else ""   # profile_step#k: the step
        name = _key(ops[-1].name) if ops else (f"{OUTSIDE} in {where}" if where else OUTSIDE)
        out[name] = out.get(name, 0.0) + (e - s)
    return out


def calls_per_step(events, windows, names: set[str]) -> dict[str, float]:
    """Of the ops among `names`, how many start in a step window, per step."""
    n = len(windows) or 1
    out: dict[str, float] = {}
    for e in events:
        key = _key(e.name)
        if e.cat == "cpu_op" and key in names and any(lo <= e.ts < hi for lo, hi in windows):
            out[key] = out.get(key, 0.0) + 1 / n
    return out


def folder(prof: Path, top: int) -> dict:
    res = {}
    for tf in sorted((prof / "traces").glob("*.trace.json.gz")):
        meta = json.loads(Path(str(tf).replace(".trace.json.gz", ".meta.json")).read_text())
        t = tr.load(tf)
        ra = RankAnalysis(t, meta)
        steps = host_pieces(ra)
        main = [e for e in t.events if e.tid == ra.main_tid]
        acc: dict[str, float] = {}
        for pieces in steps:
            for k, v in holders(main, pieces).items():
                acc[k] = acc.get(k, 0.0) + v
        n = len(steps) or 1
        per = {k: v / n / 1e3 for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}
        calls = calls_per_step(main, [(st.start_us, st.end_us) for st in ra.steps], set(per))
        total = sum(per.values())
        res[tf.name.split(".")[0]] = {"host_ms": total, "top": dict(list(per.items())[:top]),
                                      "all": per, "calls_per_step": calls}
        print(f"{prof.name} {tf.name.split('.')[0]}: host {total:.1f} ms a step; "
              + ", ".join(f"{k} {v:.1f}" + (f" ({calls[k]:.0f} calls)" if k in calls else "")
                          for k, v in list(per.items())[:top]), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    out = {str(p): folder(p, a.top) for p in a.folders}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
