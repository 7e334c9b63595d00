"""A `profile` folder -> the profile summary the solver fits to (`calibration.Summary`).

The figures are those of the profile's analysis (analysis.json, written by `profile`; its rows
are the planner's components, docs/profile.md): the measured side of the step breakdown of the
pipeline stage the planner describes (the mean of its profiled ranks), each compute part,
exposed communication by kind, the DP collectives' total (overlapped or not) and the host time.
"Other" communication (the world group, the optimizer's instance group) has no component of
its own in the model: it counts as host time, which closes the step. On a GPU each rank's
record (ranks/rank<R>.json, profile/capture.py) holds its allocator's peaks; the fullest rank's
are the memory the calibration fits to (a CPU profile has none).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .calibration import Summary

PART_ROWS = {"qkv": "GEMM QKV", "attention": "attention core", "proj": "GEMM attention out proj",
             "ffn_up": "GEMM FFN up/gate", "ffn_down": "GEMM FFN down", "logits": "GEMM LM head",
             "elementwise": "other compute"}
EXPOSED_ROWS = {"TP": "TP exposed", "CP": "CP exposed", "PP": "PP exposed (incl. bubble)",
                "DP": "DP exposed"}
HOST_ROWS = ("host gaps", "other comm exposed")


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
    alloc, reserved = peak_memory(folder)
    p = cfg.parallel
    return Summary(
        source=str(folder.resolve()), system=cfg.system.id, model=cfg.model.name,
        precision=cfg.precision.compute, racks=cfg.system.racks, tp=p.tp, pp=p.pp, vp=p.vp or 1,
        cp=p.cp, minibs=cfg.batch.minibs, mbs=cfg.batch.micro_batch_size,
        config=str(Path(cfg.source).resolve()) if cfg.source else "",
        step_s=float(res["measured_step_s"]), compute_s=compute_s,
        gemm_share_of_compute=gemm / compute_s,
        ffn_share_of_compute=(parts["ffn_up"] + parts["ffn_down"]) / compute_s,
        parts=tuple(sorted(parts.items())),
        exposed=tuple(sorted((k, float(rows[v])) for k, v in EXPOSED_ROWS.items())),
        dp_total_s=sum(dp_total) / len(dp_total) if dp_total else 0.0,
        host_s=sum(float(rows.get(r, 0.0)) for r in HOST_ROWS),
        memory_allocated_gb=alloc, memory_reserved_gb=reserved)


def median_summary(summaries: list[Summary]) -> Summary:
    """One summary of several profiles of the same run: the median of each measured figure (a
    machine whose speed drifts between profiles meets the fit at its middle). Its source names
    every folder."""
    import statistics
    from dataclasses import fields, replace
    if len(summaries) == 1:
        return summaries[0]
    first = summaries[0]
    out: dict[str, Any] = {}  # Summary's fields, each of its own type
    for f in fields(Summary):
        vals = [getattr(s, f.name) for s in summaries]
        if f.name in ("parts", "exposed"):
            keys = sorted({k for v in vals for k, _ in v})
            out[f.name] = tuple((k, statistics.median(dict(v).get(k, 0.0) for v in vals))
                                for k in keys)
        elif isinstance(vals[0], float) and all(isinstance(v, float) for v in vals):
            out[f.name] = statistics.median(vals)
    parts: dict[str, float] = dict(out.get("parts", ()))
    if parts:  # the compute and its shares: of the median parts, so that they add up
        compute_s = sum(parts.values())
        out.update(compute_s=compute_s,
                   gemm_share_of_compute=(compute_s - parts.get("elementwise", 0.0)) / compute_s,
                   ffn_share_of_compute=(parts.get("ffn_up", 0.0) + parts.get("ffn_down", 0.0))
                   / compute_s)
    return replace(first, **out, source="median of " + ", ".join(s.source for s in summaries))


def peak_memory(folder: Path) -> tuple[float | None, float | None]:
    """The fullest rank's allocator peaks (max_memory_allocated, max_memory_reserved, GB) over
    the ranks' records; (None, None) when no rank recorded memory (a CPU profile)."""
    recs = []
    for path in sorted((folder / "ranks").glob("rank*.json")):
        mem = _read(path, "a rank record of `profile`").get("memory")
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
    for k in ("model", "precision"):
        if k in m:
            theirs[k] = m[k]
    mine.update(model=cfg.model.name, precision=cfg.precision.compute)
    return [f"{k}: the profile has {theirs[k]!r}, the config {mine[k]!r}" for k in theirs
            if theirs[k] is not None and theirs[k] != mine[k]]


def first_contact(path: str | Path, prior, system: str | None = None):
    """A partial calibration from first contact's report (its `layer_bf16` check: forward +
    backward of one 405B-width layer in BF16 with megatron-core's local, unfused attention, at
    two shapes). The layer time fixes one constant: the BF16 GEMM efficiency, solved so that the
    planner's time of the "full" layer, with the unfused attention that ran, is the measured
    one; everything else stays `prior`. Returns (Fitted, Summary, check), the check holding
    both shapes' predicted and measured times (the "tp4_shard" one is a prediction). The report
    names its GPU, not always the system file: `system` when it does not."""
    from dataclasses import replace as _replace

    from ..config.schema import ModelConfig
    from . import compute
    from .context import Context
    from .spec import make_config
    path = Path(path)
    doc = _read(path, "give the JSON report of `python -m llama31_405b first-contact`")
    checks = {c.get("name"): c for c in doc.get("checks", [])}
    layer = checks.get("layer_bf16")
    if not layer or layer.get("status") != "passed":
        raise ProfileSummaryError(f"{path}: no passed layer_bf16 check (first contact's layer "
                                  "phase): nothing to calibrate from")
    named = (doc.get("meta") or {}).get("system")
    if named and system and named != system:
        raise ProfileSummaryError(f"{path}: first contact ran on system {named!r}, --system asks "
                                  f"for {system!r}")
    system = named or system
    if not system:
        gpu = (checks.get("gpu") or {}).get("data", {}).get("name", "not recorded")
        raise ProfileSummaryError(f"{path}: the report does not name the system (its GPU: {gpu}); "
                                  "give --system (llama31_405b/systems/*.toml)")
    rows = {k: v for k, v in layer.get("data", {}).items() if isinstance(v, dict) and "fwd_s" in v}
    if "full" not in rows:
        raise ProfileSummaryError(f"{path}: layer_bf16 has no 'full' shape")

    def layer_s(shape: dict, fit) -> float:
        tp = 128 // shape["heads"]
        cfg = make_config(system, 1, tp=tp, pp=1, vp=1, cp=1, minibs=1, precision="bf16",
                          model=ModelConfig(seq_length=shape["seq"]))
        ctx = Context.of(cfg)
        ctx = _replace(ctx, system=_replace(ctx.system, attention_kernel="unfused"))
        fwd, bwd = compute.chunk_parts(ctx, 1, False, False, fit)
        return fwd.total + bwd.total

    full = rows["full"]
    measured = full["fwd_s"] + full["bwd_s"]
    lo, hi = 1e-3, 1.0
    fit = prior
    for _ in range(60):  # bisection: the layer time falls as the fraction rises
        mid = (lo + hi) / 2
        fit = _replace(prior, gemm_fraction=(("bf16", mid),))
        lo, hi = (mid, hi) if layer_s(full, fit) > measured else (lo, mid)
    check = {f"{k}_measured_s": v["fwd_s"] + v["bwd_s"] for k, v in rows.items()}
    check.update({f"{k}_predicted_s": layer_s(v, fit) for k, v in rows.items()})
    s = Summary(source=str(path.resolve()), system=system, model=ModelConfig().name,
                precision="bf16", racks=1, tp=1, pp=1, vp=1, cp=1, minibs=1, step_s=measured,
                compute_s=measured, gemm_share_of_compute=1.0, ffn_share_of_compute=0.0)
    return fit, s, check


def synthetic_profile(folder: str | Path, cfg, fit, with_memory: bool = False) -> Path:
    """Write a profile folder of the planner's own prediction for `cfg` with the constants
    `fit` (profile.json and analysis.json, the rows `profile` writes; with `with_memory`, rank
    0's record with the allocator peaks the memory model predicts, as a GPU profile has them):
    what the calibration's round trip is tested on. It holds no trace: not an MLPerf run, and
    nothing to re-analyse."""
    from .context import Context
    from .costs import plan
    from .memory import memory
    from .step import breakdown
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=False)
    ctx = Context.of(cfg)
    b = breakdown(ctx, fit)
    p = plan(ctx, fit)
    gather = 0.0 if p.overlap_param else sum(c.gather_s for c in p.chunks[b.rank])
    comp = {f"compute_{k}_s": v for k, v in b.compute_s.items()}
    values = {"GEMM QKV": comp["compute_qkv_s"], "attention core": comp["compute_attention_s"],
              "GEMM attention out proj": comp["compute_proj_s"],
              "GEMM FFN up/gate": comp["compute_ffn_up_s"], "GEMM FFN down": comp["compute_ffn_down_s"],
              "GEMM LM head": comp["compute_logits_s"], "other compute": comp["compute_elementwise_s"],
              "optimizer": b.optimizer_s, "TP exposed": b.tp_s, "CP exposed": b.cp_s,
              "PP exposed (incl. bubble)": b.pp_s + b.bubble_s, "DP exposed": b.dp_exposed_s,
              "other comm exposed": 0.0, "host gaps": b.host_s}
    lay = cfg.parallel
    (folder / "profile.json").write_text(json.dumps({
        "kind": "synthetic profile written by the planner (not a measurement)", "mlperf_run": False,
        "config": cfg.source, "system": cfg.system.id, "model": cfg.model.name,
        "precision": cfg.precision.compute,
        "layout": {"tp": lay.tp, "pp": lay.pp, "vp": lay.vp or 1, "cp": lay.cp, "dp": cfg.derived.dp}},
        indent=1))
    (folder / "analysis.json").write_text(json.dumps({
        "measured_step_s": b.step_s, "compared_ranks": [0],
        "comparison": [{"component": k, "measured_s": v} for k, v in values.items()],
        "ranks": {"0": {"comm": {"DP": {"role": "DP", "total_s": b.dp_total_s + gather}}}}},
        indent=1))
    if with_memory:
        mem = memory(ctx, fit)
        alloc = mem.total_gb - mem.fragmentation_gb - mem.reserved_gb
        (folder / "ranks").mkdir()
        (folder / "ranks" / "rank00000.json").write_text(json.dumps({
            "rank": 0, "memory": {"max_allocated_gb": alloc,
                                  "max_reserved_gb": alloc + mem.fragmentation_gb,
                                  "capacity_gb": mem.capacity_gb}}, indent=1))
    return folder
