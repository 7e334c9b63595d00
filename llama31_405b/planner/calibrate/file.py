"""The calibration file: the constants `plan --calibrate PROFILE_DIR` fitted, as data (TOML),
naming the profile they came from; `plan`, `plan --write-configs`, `profile` and the memory
check (`config check`, `compliance precheck`, `launch preflight`) use it with `--calibration FILE`.

    [calibration]   where it came from: the profile folder (or the publication), its config,
                    system, model, GEMM precision and layout, when it was written, and the
                    planner's model revision it was fitted under (`MODEL_REVISION`)
    [fitted]        the `constants.Fitted` constants (the four of the published fit, the GEMM
                    efficiency of the profiled precision, the linear parts' rates relative to the
                    FFN's, each part's time per layer sequence or pass that does not grow
                    with its work,
                    the communication scales or the transport's latency, the host time per
                    layer pass, the memory model's activation scale and fragmentation)
    [measured]      the profile summary it was fitted to (`summary.Summary`)
    [check]         the simulated step of the profiled layout with these constants, next to the
                    measurement (they agree: the fit reproduces what it was fitted to;
                    `solver.check`)
    [check.also_N]  a fit of several layouts (`joint.solve_joint`): the same for each further
                    layout ([run] and [measured] are the first's; [calibration] `also` names the
                    others); an over-determined fit, so no layout's check need agree exactly

A calibration describes one system, model and GEMM precision, fitted under one revision of the
planner's model; a config of another, or a file of another revision (constants fitted to other
equations; a file written before revisions were recorded counts as another), is refused
(`mismatches`), naming the field and both values. A file is never overwritten.
"""
from __future__ import annotations

import json
import time
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from .constants import MODEL_REVISION, Fitted
from .summary import Summary, summary_from_dict

TABLES = ("gemm_fraction", "attention_fraction", "probe_scale", "gemm_part_scale", "call_s",
          "comm_scale")


@dataclass(frozen=True)
class Calibration:
    path: str
    fit: Fitted
    summary: Summary
    gemm_precision: str
    """The precision the profiled GEMMs executed in (emulated NVFP4: FP32)."""
    partial: bool = False
    """Fitted from first contact's layer phase (compute rates of one layer), not a profile."""
    model_revision: int | None = None
    """The planner's model revision the constants were fitted under; None: not recorded (a
    file written before revision 4)."""


def _value(v) -> str:
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, list):
        return json.dumps(v)
    return str(v)


def _section(name: str, items: dict) -> list[str]:
    lines = [f"[{name}]"]
    subs = []
    for k, v in items.items():
        if v is None:
            continue
        if isinstance(v, tuple | dict):
            subs.append((k, dict(v)))
            continue
        lines.append(f"{k} = {_value(v)}")
    for k, d in subs:
        if d:
            lines += ["", f"[{name}.{k}]", *(f"{a} = {_value(b)}" for a, b in d.items())]
    return lines + [""]


def render(summary: Summary, fit: Fitted, gemm_precision: str, check: dict,
           partial: bool = False, also: list[tuple[Summary, dict]] | None = None) -> str:
    head = {"source": summary.source, "config": summary.config, "system": summary.system,
            "model": summary.model, "precision": summary.precision,
            "gemm_precision": gemm_precision, "partial": partial, "layout": summary.layout,
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model_revision": MODEL_REVISION}
    if also:
        head["also"] = [f"{s.layout} (measured step {s.step_s!r} s, {s.source})" for s, _ in also]
        check = dict(check) | {f"also_{i}": ch for i, (_, ch) in enumerate(also, 1)}
    run = {f.name: getattr(summary, f.name) for f in fields(Summary)}
    measured = {k: run.pop(k) for k in list(run) if k not in
                ("source", "system", "model", "precision", "racks", "tp", "pp", "vp", "cp", "minibs",
                 "mbs", "config")}
    out = ["# Planner calibration written by `python -m llama31_405b plan --calibrate` "
           "(docs/planner.md).", "# Use: plan ... --calibration THIS_FILE; do not edit by hand.",
           ""]
    out += _section("calibration", head)
    out += _section("fitted", {f.name: getattr(fit, f.name) for f in fields(Fitted)})
    out += _section("run", run)
    out += _section("measured", measured)
    out += _section("check", check)
    return "\n".join(out)


def write(path: str | Path, summary: Summary, fit: Fitted, gemm_precision: str,
          check: dict, partial: bool = False,
          also: list[tuple[Summary, dict]] | None = None) -> Path:
    """Write the file, complete before it appears (a temporary name beside it, moved into
    place by outputs.publish); an existing file is never overwritten (OutputExists, a
    FileExistsError)."""
    from ...outputs import create_exclusive, publish, temp_sibling
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = create_exclusive(temp_sibling(path),
                           render(summary, fit, gemm_precision, check, partial, also))
    try:
        return publish(tmp, path, what="calibration", advice="give another --out")
    finally:
        tmp.unlink(missing_ok=True)


def read(path: str | Path) -> Calibration:
    """A calibration file; ValueError naming the file and the key when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such calibration file (write one with `plan --calibrate "
                         "PROFILE_DIR --calibration-out FILE`)")
    try:
        with path.open("rb") as f:
            d = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not TOML ({e})") from None
    for sec in ("calibration", "fitted", "run", "measured"):
        if sec not in d:
            raise ValueError(f"{path}: no [{sec}] section: not a calibration file written by "
                             "`plan --calibrate`")
    raw = dict(d["fitted"])
    for t in TABLES:
        raw[t] = tuple(sorted((str(k), float(v)) for k, v in raw.get(t, {}).items()))
    names = {f.name for f in fields(Fitted)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ValueError(f"{path}: [fitted] has unknown keys {unknown}")
    try:
        fit = Fitted(**raw)
    except TypeError as e:
        raise ValueError(f"{path}: [fitted]: {e}") from None
    summary = summary_from_dict(d, str(path))
    prec = d["calibration"].get("gemm_precision", summary.precision)
    rev = d["calibration"].get("model_revision")
    if rev is not None and (isinstance(rev, bool) or not isinstance(rev, int)):
        raise ValueError(f"{path}: [calibration] model_revision = {rev!r}: not a whole number")
    return Calibration(path=str(path), fit=fit, summary=summary, gemm_precision=prec,
                       partial=bool(d["calibration"].get("partial", False)), model_revision=rev)


def mismatches(cal: Calibration, cfg) -> list[str]:
    """Why `cfg` cannot use this calibration: another system, model or GEMM precision (each
    naming the field and both values); [] when it can. A partial calibration (first contact's
    layer phase) fits no GEMM precision of the plan: system and model only."""
    from ...systems import load_system
    from ..compute import executed_precision
    s = cal.summary
    checks = [("system.id", cfg.system.id, s.system), ("model.name", cfg.model.name, s.model)]
    if not cal.partial:
        checks.append(("precision.compute (as executed on this system)",
                       executed_precision(cfg.precision.compute, load_system(cfg.system.id)),
                       cal.gemm_precision))
    bad = [f"{cal.path}: calibrated for {field} = {theirs!r}, the config has {mine!r}; "
           "calibrate from a profile of this system, model and precision or drop --calibration"
           for field, mine, theirs in checks if mine != theirs]
    if cal.model_revision != MODEL_REVISION:
        was = ("records no model revision (written before revision 4)" if cal.model_revision is None
               else f"was fitted under model revision {cal.model_revision}")
        bad.append(f"{cal.path}: {was}; the planner's model is at revision {MODEL_REVISION} "
                   "(docs/planner.md, \"Model revisions\"): its constants belong to other "
                   "equations; fit again from the same profile folders with `plan --calibrate "
                   "FOLDER... --calibration-out NEW_FILE` or drop --calibration")
    return bad
