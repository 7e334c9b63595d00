"""`plan --calibrate PROFILE_DIR --calibration-out FILE`: the planner's constants fitted to a
measured profile (docs/planner.md, "Calibrating from a profile"). A file instead of a folder is
first contact's JSON report: a partial calibration (the BF16 GEMM rate of one layer). Several
folders of the same run (profiled at different times) fit the median of each measured figure;
folders of several layouts (one `--config` per layout) fit one set of constants to them all.
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


def _configs(args, srcs: list[Path], m: dict):
    """The profiled configs (`--config`, else the first folder's profile.json names it) and each
    folder's layout among them: ([(config, [folders])...], None) or (None, exit status)."""
    from ..planner import calibrate as cal
    from .options import load_or_report
    paths = args.config or [m.get("config")]
    cfgs = []
    for path in paths:
        if not path or not Path(path).is_file():
            return None, _err([f"{srcs[0]}/profile.json: its config {path!r} is not there; give "
                               "the profiled config with --config"])
        cfg = load_or_report(path, None)
        if cfg is None:
            return None, 2
        cfgs.append(cfg)
    try:
        if len(cfgs) == 1:
            bad = [f"{s}: {x}" for s in srcs for x in cal.layout_mismatches(s, cfgs[0])]
            groups = [(cfgs[0], srcs)]
        else:
            bad, groups = _grouped(srcs, cfgs, paths)
    except cal.ProfileSummaryError as e:
        return None, _err([str(e)])
    first = cfgs[0]
    for flag, field, mine, theirs in (("--system", "system", args.system, first.system.id),
                                      ("--precision", "precision", args.precision,
                                       first.precision.compute)):
        if mine and mine != theirs:
            bad.append(f"{srcs[0]}: a profile of {field} {theirs!r}, {flag} asks for {mine!r}")
    if bad:
        return None, _err(["the profile is not of the run asked for:", *bad])
    return groups, None


def _grouped(srcs: list[Path], cfgs: list, paths: list[str]) -> tuple[list[str], list]:
    """Each folder matched to the one --config of its layout; a joint fit's configs must be of
    one system, model and precision, and every config must have a folder."""
    from ..planner import calibrate as cal
    bad: list[str] = []
    folders: list[list[Path]] = [[] for _ in cfgs]
    for s in srcs:
        match = [i for i, c in enumerate(cfgs) if not cal.layout_mismatches(s, c)]
        if len(match) == 1:
            folders[match[0]].append(s)
        else:
            bad.append(f"{s}: its layout is that of {len(match)} of the --config files "
                       f"({', '.join(paths[i] for i in match) or 'none'}); give exactly one "
                       "--config per profiled layout")
    for i, c in enumerate(cfgs):
        if not folders[i]:
            bad.append(f"--config {paths[i]}: no folder of its layout among --calibrate's")
        for field, mine, theirs in (("system.id", c.system.id, cfgs[0].system.id),
                                    ("model.name", c.model.name, cfgs[0].model.name),
                                    ("precision.compute", c.precision.compute,
                                     cfgs[0].precision.compute)):
            if mine != theirs:
                bad.append(f"--config {paths[i]}: {field} {mine!r}, --config {paths[0]} has "
                           f"{theirs!r}: one calibration describes one system, model and precision")
    return bad, list(zip(cfgs, folders))


def calibrate(args) -> int:
    """Check the arguments against the profiles, then the calibrate package's stages in a line:
    each layout's summary (`from_profile`, the median of its folders), the constants (`solve`,
    or `solve_joint` of several layouts), the file (`write`, with the `check` of the fit against
    each measurement)."""
    from ..planner import calibrate as cal
    from ..planner.compute import gemm_precision
    from ..planner.context import Context
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
    groups, rc = _configs(args, srcs, m)
    if groups is None:
        return rc or 2
    try:
        runs = [(cal.median_summary([cal.from_profile(s, cfg) for s in folders]), cfg)
                for cfg, folders in groups]
        fit = cal.solve_joint(runs)
    except ValueError as e:
        return _err([str(e)])
    summary, cfg = runs[0]
    precision = gemm_precision(Context.of(cfg))
    checked = [cal.check(s, fit, c) for s, c in runs]
    path = cal.write(out, summary, fit, precision, checked[0],
                     also=[(s, ch) for (s, _), ch in zip(runs[1:], checked[1:])])
    print(f"calibration of {cfg.system.id} / {cfg.model.name} / {precision} GEMMs from "
          f"{', '.join(map(str, srcs))} ({'; '.join(s.layout for s, _ in runs)}) written to "
          f"{path}")
    for f in fields(fit):
        print(f"  {f.name} = {getattr(fit, f.name)}")
    for (s, _), ch in zip(runs, checked):
        graphed = ("" if s.eager_step_s is None else
                   f" (replayed: full-iteration CUDA graphs; the traced eager step "
                   f"{s.eager_step_s * 1e3:.1f} ms)")
        print(f"  the profiled step{f' of {s.layout}' if len(runs) > 1 else ''}: simulated "
              f"{ch['simulated_step_s'] * 1e3:.1f} ms, measured {s.step_s * 1e3:.1f} ms{graphed}")
    return 0
