"""The summaries behind the published table, in a folder meant for committing.

A profile's analysis.json is about 40 KB at 4 ranks (27 KB of it the per-rank detail: every
process group's ops), some 1 MB for a run of this proof: too much to commit per run. A summary
keeps exactly what the table and the calibration read, as the files `profile` writes, so that
the calibration's own reader (`calibrate.from_profile`) reads it unchanged:

* analysis.json: the step (`measured_step_s`), the compared ranks, the rows (`comparison`:
  component and measured seconds), the profiler's overhead ratio, the exposed time spent
  waiting for a slower peer by dimension (`waiting_for_peers`; from run 2026-12-06T0459Z on),
  and per compared rank its process groups' role and total time (the DP collectives' total);
* ranks/rank<R>.json: what `from_profile` reads of a rank record (CUDA graphs, the replayed and
  eager timings, the allocator's peaks and when they were read, rank 0's precision probe);
* profile.json: the profile's manifest as written (its `config` the path it ran with).

The run folder (docs/planner_proof/<run>/):

    proof.toml                      the proof file the run was made under (a copy)
    run.json                        when, where (CPUs, load before and after), the commit
    loads.json                      the 1-minute load average before and after every profile
    speed.json                      the reference GEMM's time (ms) before and after every
                                    profile (bench/planner_vs_measured.py `reference_ms`)
    retries.json                    the attempts profiled again, the machine slow around them
                                    (their reference times, the baseline, the kept folder)
    layouts/<name>/config.toml      the layout (committed form: the prediction reads it)
    layouts/<name>/r<k>/...         each round's summary (above)
    calibration/<section>.toml      `plan --calibrate` on the section's fit layouts' rounds
    table.json, table.md            the published table (bench/planner_proof/derive.py)

Nothing is overwritten: an existing run folder is refused, naming it.
"""
from __future__ import annotations

import json
from pathlib import Path

ANALYSIS_KEYS = ("kind", "measured_step_s", "compared_ranks", "overhead_ratio",
                 "waiting_for_peers")
RECORD_KEYS = ("rank", "cuda_graphs", "baseline_step_s", "eager_step_s", "memory", "memory_at",
               "precision_probe")


def refuse_existing(*paths: Path) -> None:
    """Refuse, naming the first, where any of `paths` exists (before any of them is made)."""
    for path in paths:
        if Path(path).exists():
            raise FileExistsError(f"{path} exists: a summaries folder is never overwritten "
                                  "(give another --out, or move it away)")


def new_folder(path: Path) -> Path:
    """Create `path` (and its parents); refuse one that exists, naming it."""
    path = Path(path)
    refuse_existing(path)
    path.mkdir(parents=True)
    return path


def reduce_analysis(a: dict) -> dict:
    out = {k: a[k] for k in ANALYSIS_KEYS if k in a}
    out["reduced"] = "bench/planner_proof/summaries.py: what the table and the calibration read"
    out["comparison"] = [{"component": r["component"], "measured_s": r["measured_s"]}
                         for r in a.get("comparison", [])]
    compared = {str(r) for r in a.get("compared_ranks", [])}
    out["ranks"] = {r: {"comm": {g: {"role": c["role"], "total_s": c["total_s"]}
                                 for g, c in v.get("comm", {}).items()}}
                    for r, v in a.get("ranks", {}).items() if r in compared}
    return out


def reduce_profile(src: Path, dest: Path) -> Path:
    """The summary of profile folder `src` in the new folder `dest`."""
    src, dest = Path(src), new_folder(Path(dest))
    (dest / "profile.json").write_text((src / "profile.json").read_text())
    a = json.loads((src / "analysis.json").read_text())
    (dest / "analysis.json").write_text(json.dumps(reduce_analysis(a), indent=1) + "\n")
    records = sorted((src / "ranks").glob("rank*.json"))
    if records:
        (dest / "ranks").mkdir()
    for path in records:
        rec = json.loads(path.read_text())
        (dest / "ranks" / path.name).write_text(
            json.dumps({k: rec[k] for k in RECORD_KEYS if k in rec}, indent=1) + "\n")
    return dest


def round_folder(run: Path, layout: str, rnd: int) -> Path:
    return Path(run) / "layouts" / layout / f"r{rnd}"
