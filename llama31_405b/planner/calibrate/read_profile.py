"""A `profile` folder -> the summary the solver fits to (`summary.Summary`).

The figures are those of the profile's analysis (analysis.json, written by `profile`; its rows
are the planner's components, docs/profile.md): the measured side of the step breakdown of the
pipeline stage the planner describes (the mean of its profiled ranks), each compute part,
exposed communication by kind, the DP collectives' total (overlapped or not) and the host time.
"Other" communication (the world group, the optimizer's instance group) has no component of
its own in the model: it counts as host time, which closes the step. A profile of a run with
full-iteration CUDA graphs traced eager steps: its figures become the replayed step's
(`graphed.as_replayed`, with the replayed / eager ratio its ranks timed). On a GPU each rank's
record (ranks/rank<R>.json, profile/capture.py) holds its allocator's peaks; the fullest rank's
are the memory the calibration fits to (a CPU profile has none); rank 0's record of a CPU
profile holds the precision probe (profile/probe.py), the rates of the precisions it did not run.
"""
from __future__ import annotations

import json
from pathlib import Path

from . import graphed
from .summary import KINDS, Summary

PART_ROWS = {"qkv": "GEMM QKV", "attention": "attention core", "proj": "GEMM attention out proj",
             "ffn_up": "GEMM FFN up/gate", "ffn_down": "GEMM FFN down", "logits": "GEMM LM head",
             "elementwise": "other compute"}
EXPOSED_ROWS = {"TP": "TP exposed", "CP": "CP exposed", "PP": "PP exposed (incl. bubble)",
                "DP": "DP exposed"}
HOST_ROWS = ("host gaps", "other comm exposed")
REPLAYED = "after the replayed steps"
"""A graphed rank record's `memory_at`: its peaks were read before the eager steps
(profile/capture.py), as a graphed run has them."""


class ProfileSummaryError(ValueError):
    """The folder is not a profile the planner can calibrate from (the message says why)."""


def _read(path: Path, what: str) -> dict:
    if not path.is_file():
        raise ProfileSummaryError(f"{path}: missing; {what}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ProfileSummaryError(f"{path}: not JSON ({e})") from None


def from_profile(folder: str | Path, cfg) -> Summary:
    """The summary of a profile folder; `cfg` is its config (`profile_config` reads it)."""
    folder = Path(folder)
    res = _read(folder / "analysis.json", "run `python -m llama31_405b profile --analyze "
                f"{folder} CONFIG` first")
    rows = {r["component"]: r["measured_s"] for r in res.get("comparison", [])}
    missing = [r for r in (*PART_ROWS.values(), *EXPOSED_ROWS.values()) if r not in rows]
    if missing:
        raise ProfileSummaryError(f"{folder}/analysis.json: no row {missing[0]!r} (written by an "
                                  "older `profile`? analyse the folder again with --analyze)")
    parts = {k: float(rows[v]) for k, v in PART_ROWS.items()}
    compute_s = sum(parts.values())
    if compute_s <= 0 or parts["ffn_up"] + parts["ffn_down"] <= 0:
        raise ProfileSummaryError(f"{folder}/analysis.json: no compute (or no FFN GEMM) measured "
                                  "on the compared stage")
    ranks = [str(r) for r in res.get("compared_ranks", [])]
    dp_total = [sum(g["total_s"] for g in res["ranks"][r]["comm"].values() if g["role"] == "DP")
                for r in ranks if r in res.get("ranks", {})]
    gemm = compute_s - parts["elementwise"]
    records = rank_records(folder)
    alloc, reserved = peak_memory(records)
    p = cfg.parallel
    s = Summary(
        source=str(folder.resolve()), system=cfg.system.id, model=cfg.model.name,
        precision=cfg.precision.compute, racks=cfg.system.racks, tp=p.tp, pp=p.pp, vp=p.vp or 1,
        cp=p.cp, minibs=cfg.batch.minibs, mbs=cfg.batch.micro_batch_size,
        config=str(Path(cfg.source).resolve()) if cfg.source else "",
        step_s=float(res["measured_step_s"]), compute_s=compute_s,
        gemm_share_of_compute=gemm / compute_s,
        ffn_share_of_compute=(parts["ffn_up"] + parts["ffn_down"]) / compute_s,
        parts=tuple(sorted(parts.items())),
        exposed=tuple(sorted((k, float(rows[v])) for k, v in EXPOSED_ROWS.items())),
        waiting=tuple(sorted((k, float(v)) for k, v in (res.get("waiting_for_peers") or {}).items()
                             if k in KINDS)),
        dp_total_s=sum(dp_total) / len(dp_total) if dp_total else 0.0,
        host_s=sum(float(rows.get(r, 0.0)) for r in HOST_ROWS),
        memory_allocated_gb=alloc, memory_reserved_gb=reserved, probe_s=probe_seconds(records))
    compared = [r for r in records if str(r.get("rank")) in ranks] or records
    try:
        ratio = graphed.replay_ratio(compared, str(folder))
    except ValueError as e:
        raise ProfileSummaryError(str(e)) from None
    return s if ratio is None else graphed.as_replayed(s, ratio)


def rank_records(folder: Path) -> list[dict]:
    """Every rank's record of the profile (ranks/rank<R>.json: step timings, allocator peaks)."""
    return [_read(path, "a rank record of `profile`")
            for path in sorted((folder / "ranks").glob("rank*.json"))]


def probe_seconds(records: list[dict]) -> tuple[tuple[str, float], ...]:
    """The precision probe's seconds ("<operation>_<precision>" -> s) of the record that has one
    (rank 0 of a CPU profile: profile/probe.py); () where none has (a GPU profile, or one
    written before the probe)."""
    for rec in records:
        probe = rec.get("precision_probe")
        if probe:
            return tuple(sorted((str(k), float(v)) for k, v in probe["seconds"].items()))
    return ()


def peak_memory(records: list[dict]) -> tuple[float | None, float | None]:
    """The fullest rank's allocator peaks (max_memory_allocated, max_memory_reserved, GB) over
    the ranks' records; (None, None) when no rank recorded memory (a CPU profile). A graphed
    run's record counts only when its peaks were read after the replayed steps (`REPLAYED`):
    an older `profile` read them after the eager steps too, the captured graph's pool held while
    they allocated outside it: no graphed run's memory."""
    recs = []
    for rec in records:
        mem = rec.get("memory")
        if rec.get("cuda_graphs") and rec.get("memory_at") != REPLAYED:
            continue
        if mem:
            recs.append((float(mem["max_allocated_gb"]), float(mem["max_reserved_gb"])))
    if not recs:
        return None, None
    return max(recs)


def manifest(folder: str | Path) -> dict:
    """The profile's profile.json (its config path, system, layout)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ProfileSummaryError(f"{folder}: no such folder (give a folder written by "
                                  "`python -m llama31_405b profile`)")
    return _read(folder / "profile.json", "not a folder written by `profile`")


def layout_mismatches(folder: str | Path, cfg) -> list[str]:
    """Where `cfg` is not the profiled run: system and layout against the folder's profile.json
    (field, the profile's value, the config's)."""
    m = manifest(folder)
    lay = m.get("layout") or {}
    mine = {"system": cfg.system.id, "tp": cfg.parallel.tp, "pp": cfg.parallel.pp,
            "vp": cfg.parallel.vp or 1, "cp": cfg.parallel.cp, "dp": cfg.derived.dp}
    theirs = {"system": m.get("system"), **{k: lay.get(k) for k in ("tp", "pp", "vp", "cp", "dp")}}
    for k in ("model", "precision", "dp_overlap"):   # dp_overlap: profiles since 2026-12-07
        if k in m:
            theirs[k] = m[k]
    mine.update(model=cfg.model.name, precision=cfg.precision.compute,
                dp_overlap=cfg.performance.dp_overlap())
    return [f"{k}: the profile has {theirs[k]!r}, the config {mine[k]!r}" for k in theirs
            if theirs[k] is not None and theirs[k] != mine[k]]
