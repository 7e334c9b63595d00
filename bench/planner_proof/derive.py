"""The published table, derived from a summaries folder (summaries.py) alone: what the bench
prints after profiling, and what tests/test_planner_proof.py re-derives from the committed folder.

The derivation uses the planner's own entry points, not copies of them:

* the calibration: `plan --calibrate FOLDER... --calibration-out FILE --config CONFIG...` (the
  CLI, `llama31_405b.cli.main`, in process) on every round of the section's fit layouts, one
  `--config` per fit layout (two layouts: one fit of both, `calibrate.solve_joint`); where it
  refuses, the section holds the refusal instead of rows;
* the measured side: `calibrate.from_profile` (the calibration's reader; a graphed profile's
  figures as the replayed step's) with the rows' optimizer time, the median over the rounds;
* the predicted side: `planner.predict(cfg, fit)` with the constants of the calibration file
  (`calibrate.read`), and `step.breakdown`'s core share for the core-share pairs.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from .spec import PROOF, ROOT, Layout, Proof, Section, load, load_layouts
from .summaries import round_folder

if TYPE_CHECKING:
    from llama31_405b.planner.calibrate import Calibration

COLUMNS = ("step", "compute", "TP", "PP", "DP", "host")


def calibrate(folders: list[Path], configs: list[Path], out: Path) -> tuple[Calibration | None, str]:
    """`plan --calibrate` on `folders` with `configs` (one per layout), writing `out`: (the
    calibration, "") or (None, what the CLI said when it refused)."""
    from llama31_405b.cli import main
    from llama31_405b.planner import calibrate as cal
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["plan", "--calibrate", *map(str, folders), "--calibration-out", str(out),
                   *[x for c in configs for x in ("--config", str(c))]])
    if rc:
        return None, err.getvalue().strip()
    return cal.read(out), ""


def measured(folder: Path, cfg) -> dict:
    from llama31_405b.planner import calibrate as cal
    s = cal.from_profile(folder, cfg)
    a = json.loads((Path(folder) / "analysis.json").read_text())
    rows = {r["component"]: r["measured_s"] for r in a["comparison"]}
    ex = dict(s.exposed)
    wait = a.get("waiting_for_peers")   # from run 2026-12-06T0459Z on (profile/waits.py)
    return ({"waiting": sum(wait.values())} if wait is not None else {}) | {
            "step": s.step_s, "compute": s.compute_s, "TP": ex.get("TP", 0.0),
            "PP": ex.get("PP", 0.0), "DP": ex.get("DP", 0.0),
            "host": (s.host_s or 0.0) + float(rows.get("optimizer", 0.0)),
            "overhead_ratio": float(a.get("overhead_ratio") or 0.0)}


def predicted(cfg, fit) -> dict:
    from llama31_405b.planner import predict
    from llama31_405b.planner.context import Context
    from llama31_405b.planner.step import breakdown
    b = predict(cfg, fit).breakdown
    return {"step": sum(b[k] for k in ("compute_total_s", "tp_s", "cp_s", "pp_s", "bubble_s",
                                       "dp_s", "optimizer_s", "host_s")),
            "compute": b["compute_total_s"], "TP": b["tp_s"], "PP": b["pp_s"] + b["bubble_s"],
            "DP": b["dp_s"], "host": b["host_s"] + b["optimizer_s"],
            "core_share": breakdown(Context.of(cfg), fit).core_share}


def verdict(m: float, p: float, tol: float, floor: float) -> str:
    """"ok" within `tol` of the prediction, "miss" outside, "negligible" where both are under
    `floor` seconds (the proof's share of the measured step)."""
    if max(m, p) < floor:
        return "negligible"
    if p <= 0:
        return "miss"
    return "ok" if abs(m / p - 1) <= tol else "miss"


def machine_speed(speeds: dict, name: str, rounds: int) -> list[float] | None:
    """`name`'s reference GEMM times (before and after each of its profiles) over the median of
    every profile's in the run: its fastest and slowest, [min, max] (None without a record:
    the runs before 2026-12-06)."""
    own = [x for r in range(1, rounds + 1) for x in speeds.get(f"{name}/r{r}", [])]
    if not own:
        return None
    ref = statistics.median(x for v in speeds.values() for x in v)
    return [min(own) / ref, max(own) / ref]


def retried(retries: dict, name: str, rounds: int) -> list[dict]:
    """`name`'s profiles taken again because the machine was slow around an attempt (the
    bench's retries.json): per slow attempt its round and its slowest reference over the
    baseline; [] where none was (and for the runs before the rule)."""
    return [{"round": r, "slowed": max(a["speed"]) / a["baseline"]}
            for r in range(1, rounds + 1) for a in retries.get(f"{name}/r{r}", [])]


def layout_row(run: Path, proof: Proof, layout: Layout, role: str, fit, records: dict) -> dict:
    """One row: the median over the rounds of each measured figure against the prediction;
    `records`: the folder's per-profile records (`read_all`)."""
    from llama31_405b.config.load import load_config
    cfg = load_config(Path(run) / "layouts" / layout.name / "config.toml")
    p = predicted(cfg, fit)
    rounds = [measured(round_folder(run, layout.name, r), cfg) for r in range(1, proof.rounds + 1)]
    m = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]
         if all(k in x for x in rounds)}
    floor = proof.negligible * m["step"]
    ver = {"step": verdict(m["step"], p["step"], proof.step_tol, 0.0)}
    ver.update({k: verdict(m[k], p[k], proof.component_tol, floor) for k in proof.components})
    loads = records.get("loads.json", {})
    ld = [x for r in range(1, proof.rounds + 1) for x in loads.get(f"{layout.name}/r{r}", [])]
    again = retried(records.get("retries.json", {}), layout.name, proof.rounds)
    return ({"retried": again} if again else {}) | {"layout": layout.name, "label": layout.label, "role": role, "measured": m,
            "predicted": p, "ratio": {k: (m[k] / p[k] if p[k] > 0 else None) for k in COLUMNS},
            "verdict": ver, "rounds": [x["step"] / p["step"] for x in rounds],
            "load": [min(ld), max(ld)] if ld else None,
            "machine": machine_speed(records.get("speed.json", {}), layout.name, proof.rounds)}


def judge(rows: list[dict]) -> dict:
    """The section's verdict over its unseen (or extra) layouts."""
    others = [r for r in rows if r["role"] != "fit"]
    by_m = [r["layout"] for r in sorted(others, key=lambda r: r["measured"]["step"])]
    by_p = [r["layout"] for r in sorted(others, key=lambda r: r["predicted"]["step"])]
    return {"layouts": len(others),
            "steps_within": sum(r["verdict"]["step"] == "ok" for r in others),
            "all_within": sum("miss" not in r["verdict"].values() for r in others),
            "misses": {r["layout"]: sorted(k for k, v in r["verdict"].items() if v == "miss")
                       for r in others if "miss" in r["verdict"].values()},
            "order_measured": by_m, "order_predicted": by_p, "ranked_as_measured": by_m == by_p}


def section(run: Path, proof: Proof, sec: Section, cal_out: Path, records: dict) -> dict:
    folders = [round_folder(run, n, r) for n in sec.fit for r in range(1, proof.rounds + 1)]
    configs = [Path(run) / "layouts" / n / "config.toml" for n in sec.fit]
    cal, refused = calibrate(folders, configs, cal_out)
    out = {"name": sec.name, "title": sec.title, "fit": list(sec.fit),
           "calibration": f"calibration/{sec.name}.toml"}
    if cal is None:
        text = refused.replace(str(Path(run).resolve()), "<run>").replace(str(run), "<run>")
        return out | {"calibration": None, "refused": text.replace(str(cal_out), "<out>")}
    rows = [layout_row(run, proof, proof.layouts[n], "fit" if n in sec.fit else "unseen",
                       cal.fit, records) for n in sec.layouts]
    return out | {"fitted": fitted_dict(cal.fit), "rows": rows, "verdict": judge(rows)}


def fitted_dict(fit) -> dict:
    from dataclasses import asdict
    return {k: (dict(v) if isinstance(v, tuple) else v) for k, v in asdict(fit).items()}


def core_share(run: Path, proof: Proof, sections: list[dict], cal_dir: Path) -> dict | None:
    """Each pair's measured compute stretch (4 ranks / 2 ranks, the medians over the rounds)
    against the same ratio predicted with the named section's calibration."""
    if not proof.core_pairs:
        return None
    from llama31_405b.config.load import load_config
    from llama31_405b.planner import calibrate as cal
    sec = next(s for s in sections if s["name"] == proof.core_calibration)
    out: dict = {"calibration": proof.core_calibration, "pairs": []}
    if sec.get("calibration") is None:
        return out | {"refused": f"section {sec['name']} has no calibration"}
    fit = cal.read(cal_dir / f"{sec['name']}.toml").fit
    for two, four in proof.core_pairs:
        m, p = {}, {}
        for n in (two, four):
            cfg = load_config(Path(run) / "layouts" / n / "config.toml")
            rounds = [measured(round_folder(run, n, r), cfg) for r in range(1, proof.rounds + 1)]
            m[n] = statistics.median(x["compute"] for x in rounds)
            p[n] = predicted(cfg, fit)
        mr, pr = m[four] / m[two], p[four]["compute"] / p[two]["compute"]
        row = {"two": two, "four": four, "measured": mr, "predicted": pr, "ratio": mr / pr,
               "model_core_share": p[four]["core_share"],
               "verdict": verdict(mr, pr, proof.component_tol, 0.0)}
        # a pair the calibration was fitted to (the fraction of communication that keeps a
        # core, calibrate/joint.py) reproduces its own measurement: marked, not a test
        out["pairs"].append(row | ({"fit": True} if two in sec["fit"] and four in sec["fit"]
                                   else {}))
    return out


def read_records(folder: Path, name: str) -> dict:
    """A run folder's per-profile record `name` (loads.json, speed.json); {} where absent."""
    path = Path(folder) / name
    return json.loads(path.read_text()) if path.exists() else {}


RECORDS = ("loads.json", "speed.json", "retries.json")
"""A run folder's per-profile records ("<layout>/r<round>" -> figures; the bench writes them)."""


def read_all(folder: Path) -> dict:
    """Every per-profile record of a run folder, by file name (`RECORDS`)."""
    return {n: read_records(folder, n) for n in RECORDS}


def tolerance(proof: Proof) -> dict:
    """The proof's tolerances as a table records them."""
    return {"step": proof.step_tol, "component": proof.component_tol,
            "negligible": proof.negligible, "components": list(proof.components)}


def derive(run: Path, cal_dir: Path) -> dict:
    """The table of the summaries folder `run`, from its proof.toml; each section's calibration
    is written to `cal_dir`/<section>.toml (a folder that must not hold them yet)."""
    run = Path(run)
    proof = load(run / "proof.toml")
    records = read_all(run)
    sections = [section(run, proof, s, Path(cal_dir) / f"{s.name}.toml", records)
                for s in proof.sections]
    from llama31_405b.planner.calibrate import MODEL_REVISION
    return {"proof_date": proof.date, "model_revision": MODEL_REVISION,
            "tolerance": tolerance(proof),
            "rounds": proof.rounds, "steps": proof.steps, "sections": sections,
            "core_share": core_share(run, proof, sections, Path(cal_dir))}


def differences(a, b, where: str = "table", rel: float = 1e-9) -> list[str]:
    """Where the derived table `a` and the committed `b` differ (floats within `rel`). A key of
    `a` set to None and absent from `b` is no difference: a constant the planner gained after
    `b` was written (Fitted.comm_core_fraction), which this derivation leaves unset too."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: only in one" for k in sorted(set(a) ^ set(b))
               if not (k in a and a[k] is None)]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{where}.{k}", rel)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items against {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]", rel)]
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return [] if math.isclose(a, b, rel_tol=rel, abs_tol=1e-15) else [f"{where}: {a!r} against {b!r}"]
    return [] if a == b else [f"{where}: {a!r} against {b!r}"]


def derive_extra(folder: Path, layouts_file: str, calibration: str,
                 given: Path | None = None) -> dict:
    """The extra.json of a `--extra` folder from it alone: its layouts' summaries predicted from
    its copy of the given calibration (calibration/given.toml), judged with the proof file's
    tolerances and rounds. The layouts and the proof file are the folder's copies (layouts.toml,
    proof.toml); a folder written before the bench kept them (the two of 2026-12-05T1200Z) reads
    `layouts_file` and the repository's proof file, whose tolerances and rounds were theirs.
    A set profiled in a proof run's rounds (the bench's `--beside`) names that run (`beside`,
    from the folder's run.json). `given`: another calibration file to predict them from
    instead (a diagnosis, never the folder's extra.json)."""
    from llama31_405b.planner import calibrate as cal
    from llama31_405b.planner.calibrate import MODEL_REVISION
    folder = Path(folder)
    lfile = folder / "layouts.toml"
    layouts = load_layouts(lfile if lfile.is_file() else ROOT / layouts_file)
    proof = load(folder / "proof.toml" if (folder / "proof.toml").is_file() else PROOF)
    records = read_all(folder)
    fit = cal.read(given or folder / "calibration" / "given.toml").fit
    rows = [layout_row(folder, proof, lay, "extra", fit, records)
            for lay in layouts.values()]
    rj = folder / "run.json"
    beside = json.loads(rj.read_text()).get("beside") if rj.is_file() else None
    return ({"beside": beside} if beside else {}) | {
            "layouts_file": layouts_file, "calibration": calibration,
            "model_revision": MODEL_REVISION, "rounds": proof.rounds,
            "tolerance": tolerance(proof),
            "rows": rows, "verdict": judge(rows)}
