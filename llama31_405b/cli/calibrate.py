"""`plan --calibrate PROFILE_DIR --calibration-out FILE`: the planner's constants fitted to a
measured profile (docs/planner.md, "Calibrating from a profile"). A file instead of a folder is
first contact's JSON report: a partial calibration (the BF16 GEMM rate of one layer). Several
folders of the same run (profiled at different times) fit the median of each measured figure.
The stages are the planner's calibrate package (planner/calibrate/__init__.py)."""
from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path


def _err(lines) -> int:
    print("error: " + "\n  ".join(lines), file=sys.stderr)
    return 2


def _first_contact(args, src: Path, out: str) -> int:
    from ..planner import calibrate
    from ..planner.calibrate.first_contact import first_contact
    fit, summary, check = first_contact(src, calibrate.fitted(), args.system)
    path = calibrate.write(out, summary, fit, "bf16", check, partial=True)
    print(f"partial calibration of {summary.system} (first contact's layer phase: BF16 GEMM "
          f"efficiency {dict(fit.gemm_fraction)['bf16']:.3f}) written to {path}")
    for k, v in check.items():
        print(f"  {k} {v * 1e3:.1f} ms")
    return 0


def calibrate(args) -> int:
    """Check the arguments against the profile, then the calibrate package's stages in a line:
    the folders' summary (`from_profile`, their median), the constants (`solve`), the file
    (`write`, with the `check` of the fit against the measurement)."""
    from ..planner import calibrate as cal
    from ..planner.compute import gemm_precision
    from ..planner.context import Context
    from .options import load_or_report
    srcs = [Path(s) for s in args.calibrate]
    src, out = srcs[0], args.calibration_out
    if not out:
        return _err(["--calibrate needs --calibration-out FILE (the calibration file to write)"])
    if Path(out).exists():
        return _err([f"--calibration-out {out}: the file exists; a calibration is never "
                     "overwritten: give another name"])
    try:
        if src.is_file():
            if len(srcs) > 1:
                return _err([f"--calibrate {src}: a first-contact report calibrates alone"])
            return _first_contact(args, src, out)
        m = cal.manifest(src)
    except cal.ProfileSummaryError as e:
        return _err([str(e)])
    cfg_path = args.config or m.get("config")
    if not cfg_path or not Path(cfg_path).is_file():
        return _err([f"{src}/profile.json: its config {cfg_path!r} is not there; give the "
                     "profiled config with --config"])
    cfg = load_or_report(cfg_path, None)
    if cfg is None:
        return 2
    try:
        bad = [f"{s}: {x}" for s in srcs for x in cal.layout_mismatches(s, cfg)]
    except cal.ProfileSummaryError as e:
        return _err([str(e)])
    for flag, field, mine, theirs in (("--system", "system", args.system, cfg.system.id),
                                      ("--precision", "precision", args.precision,
                                       cfg.precision.compute)):
        if mine and mine != theirs:
            bad.append(f"{src}: a profile of {field} {theirs!r}, {flag} asks for {mine!r}")
    if bad:
        return _err(["the profile is not of the run asked for:", *bad])
    try:
        summary = cal.median_summary([cal.from_profile(s, cfg) for s in srcs])
        fit = cal.solve(summary, cfg)
    except ValueError as e:
        return _err([str(e)])
    precision = gemm_precision(Context.of(cfg))
    checked = cal.check(summary, fit, cfg)
    path = cal.write(out, summary, fit, precision, checked)
    print(f"calibration of {cfg.system.id} / {cfg.model.name} / {precision} GEMMs from "
          f"{', '.join(map(str, srcs))} ({summary.layout}) written to {path}")
    for f in fields(fit):
        print(f"  {f.name} = {getattr(fit, f.name)}")
    graphed = ("" if summary.eager_step_s is None else
               f" (replayed: full-iteration CUDA graphs; the traced eager step "
               f"{summary.eager_step_s * 1e3:.1f} ms)")
    print(f"  the profiled step: simulated {checked['simulated_step_s'] * 1e3:.1f} ms, measured "
          f"{summary.step_s * 1e3:.1f} ms{graphed}")
    return 0
