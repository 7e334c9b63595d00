"""Committed folders checked without profiling (bench/planner_vs_measured.py `--derive`): a run's
table re-derived from its summaries and compared with the committed table.json and table.md, an
--extra folder's report likewise, and an --extra folder's measurements predicted from another
calibration (a diagnosis, printed only). Each returns the bench's exit status: 0 agrees, 1 differs,
2 another model revision (or not an --extra folder)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from . import derive, render


def rederive(run: Path) -> int:
    from llama31_405b.planner.calibrate import MODEL_REVISION
    if (run / "extra.json").is_file():
        return rederive_extra(run)
    committed = json.loads((run / "table.json").read_text())
    rev = committed.get("model_revision", 1)
    if rev != MODEL_REVISION:
        commit = json.loads((run / "run.json").read_text()).get("commit", "?")
        print(f"{run}: derived by model revision {rev}, this code is revision {MODEL_REVISION}: "
              f"re-derive it at the commit it ran at (git checkout {commit})", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        table = derive.derive(run, Path(tmp))
    return _compare(run, "table", table, committed, render.markdown(table))


def _compare(folder: Path, name: str, derived: dict, committed: dict, markdown: str) -> int:
    """Print the re-derived `markdown` and where `derived` differs from the committed
    `folder`/<name>.json and .md; 1 where either does, else 0."""
    print(markdown)
    diffs = derive.differences(derived, committed, name)
    for d in diffs:
        print(f"differs from {folder}/{name}.json: {d}")
    md = (folder / f"{name}.md").read_text() != markdown
    if md:
        print(f"{folder}/{name}.md differs from the re-derived table")
    return 1 if diffs or md else 0


def rederive_extra(folder: Path) -> int:
    """`--derive` on a `--extra` folder: its extra.json re-derived (derive.derive_extra),
    printed; exit 1 where it differs from the committed one or its extra.md, 2 for a folder of
    another model revision (the folders of 2026-12-05T1200Z record none: revision 2 wrote
    them)."""
    from llama31_405b.planner.calibrate import MODEL_REVISION
    committed = json.loads((folder / "extra.json").read_text())
    rev = committed.get("model_revision", 2)
    if rev != MODEL_REVISION:
        rj = folder / "run.json"
        commit = json.loads(rj.read_text()).get("commit", "?") if rj.is_file() else "8ade08c"
        print(f"{folder}: derived by model revision {rev}, this code is revision "
              f"{MODEL_REVISION}: re-derive it under revision {rev}'s code (git checkout "
              f"{commit}: the commit it ran at, or for the folders that record none, the first "
              "that re-derives an --extra folder)", file=sys.stderr)
        return 2
    t = derive.derive_extra(folder, committed["layouts_file"], committed["calibration"])
    if "model_revision" not in committed:
        del t["model_revision"]
    return _compare(folder, "extra", t, committed, render.extra_markdown(t))


def diagnose_extra(folder: Path, calibration: Path) -> int:
    """`--derive FOLDER --calibration CAL`: the --extra folder's summaries predicted from CAL
    instead of the calibration its header fixed, printed and never written (exit 2 for a
    calibration of another model revision or a folder that is not an --extra one)."""
    from llama31_405b.planner import calibrate
    if not (folder / "extra.json").is_file():
        print(f"{folder}: not an --extra folder (no extra.json); --calibration with --derive "
              "predicts an --extra folder's layouts", file=sys.stderr)
        return 2
    rev = calibrate.read(calibration).model_revision
    if rev != calibrate.MODEL_REVISION:
        print(f"{calibration}: fitted by model revision {rev}, this code is revision "
              f"{calibrate.MODEL_REVISION}", file=sys.stderr)
        return 2
    committed = json.loads((folder / "extra.json").read_text())
    t = derive.derive_extra(folder, committed["layouts_file"], str(calibration), calibration)
    print(render.extra_markdown(t))
    print(f"A diagnosis: {folder}'s measurements predicted from {calibration}, not from the "
          f"calibration its layouts file fixed ({committed['calibration']}: its extra.md). "
          "Nothing written.")
    return 0
