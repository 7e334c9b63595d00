"""The mark of a profile folder: it holds no MLPerf run, and the compliance and submission
commands refuse anything inside it."""
from __future__ import annotations

import json
from pathlib import Path

MARKER = "NOT_AN_MLPERF_RUN.txt"
MANIFEST = "profile.json"
KIND = "llama31_405b profile (not an MLPerf run)"
# what run_and_time.sh keeps in its LOGDIR, which with PROFILE=1 is the profile folder: the lock
# of one campaign per LOGDIR (docs/launch.md, "Folders and results")
LAUNCHER_FILES = frozenset({".run_and_time.lock"})

TEXT = """This folder was written by `python -m llama31_405b profile`: a profile of a few training
steps after the warm-up, under torch.profiler. It is NOT an MLPerf run: no run_start was logged,
no evaluation ran, and nothing here may be submitted or compliance-checked
(`compliance check` and `submission package` refuse it). See docs/profile.md.
"""


def unusable(out: str | Path) -> str | None:
    """Why `out` cannot take a profile (a non-empty folder: an earlier profile, kept, or files
    `profile` did not write), or None. The claim itself is `mark_folder`'s exclusive creation of
    the marker: of two profiles started into one folder at once, the second is refused there."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        return f"--out {out}: exists and is not a folder"
    if (out / MANIFEST).is_file() or (out / MARKER).is_file():
        return (f"--out {out}: holds an earlier profile ({MANIFEST}), kept (a result is never "
                "replaced, a calibration may name it as its source); give a new folder, or omit "
                "--out for a fresh out/profile/<config>-N")
    if out.is_dir() and any(p.name not in LAUNCHER_FILES for p in out.iterdir()):
        return (f"--out {out}: a non-empty folder that `profile` did not write; give a new or "
                "empty folder")
    return None


def mark_folder(out: Path, cfg, plan) -> None:
    """Claim the folder: the marker, then the manifest, each created exclusively (rank 0, before
    the process group exists: no other rank writes before it joined). An earlier profile's files
    make it fail (OutputExists); nothing is deleted."""
    from ..outputs import create_exclusive
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    advice = "give a new --out folder (an earlier profile is kept)"
    create_exclusive(out / MARKER, TEXT, advice=advice)
    manifest = dict(kind=KIND, mlperf_run=False, config=cfg.source, system=cfg.system.id,
                    model=cfg.model.name, precision=cfg.precision.compute,
                    batch=dict(minibs=cfg.batch.minibs, mbs=cfg.batch.micro_batch_size),
                    layout=dict(tp=cfg.parallel.tp, pp=cfg.parallel.pp, vp=cfg.parallel.vp,
                                cp=cfg.parallel.cp, dp=cfg.derived.dp),
                    dp_overlap=cfg.performance.dp_overlap(),
                    world_size=cfg.derived.world_size, skip=plan.skip, baseline=plan.baseline,
                    steps=plan.steps, ranks=plan.ranks)
    create_exclusive(out / MANIFEST, json.dumps(manifest, indent=1), advice=advice)


def profile_folder_of(path: str | Path) -> Path | None:
    """The profile folder that holds `path` (the path itself, or a parent, carries the marker);
    for a directory, also one below it. None when the path has nothing to do with a profile."""
    p = Path(path).resolve()
    for d in [p, *p.parents]:
        if (d / MARKER).is_file():
            return d
    if p.is_dir():
        for hit in p.rglob(MARKER):
            return hit.parent
    return None


def refusal(path: str | Path) -> str | None:
    """The reason to refuse `path` in compliance check / submission package, or None."""
    d = profile_folder_of(path)
    if d is None:
        return None
    return (f"{path}: inside the profile folder {d} (written by `profile`, marked by {MARKER}): "
            "a profile is not an MLPerf run (no run_start, no evaluation); check or package the "
            "logs of a `train` run instead")
