"""The outputs of scripts/h200_first_contact.py's `run` (standard library only: it runs under the
image's python3 before anything is installed): the tag that keeps a rerun's files apart from an
earlier run's in the same folder, the merge of the phases' reports into one, and the collection
of several device runs' folders into one.

Names: a run writes NAME.EXT into an empty folder; into a folder that holds an earlier run's
files, NAME.2.EXT, NAME.3.EXT, ... (`run_tag`). Nothing is ever overwritten; the latest of a
name is its highest tag (`latest`), so a phase rerun alone wins over the earlier run's report of
that phase and the other phases' reports stay as they were."""
from __future__ import annotations

import importlib.util
import itertools
import json
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tagged(name: str, tag: str) -> str:
    """"slice.json" with tag ".2" -> "slice.2.json"."""
    stem, ext = name.rsplit(".", 1)
    return f"{stem}{tag}.{ext}"


def tag_number(name: str, stem: str, ext: str) -> int | None:
    m = re.fullmatch(rf"{re.escape(stem)}(?:\.(\d+))?\.{re.escape(ext)}", name)
    return None if m is None else int(m.group(1) or 1)


def latest(out: Path, name: str) -> Path | None:
    """The highest-tagged `name` in `out` (tagged), or None."""
    stem, ext = name.rsplit(".", 1)
    found = [(k, f) for f in out.iterdir() if (k := tag_number(f.name, stem, ext)) is not None]
    return max(found)[1] if found else None


def report_module():
    """llama31_405b/first_contact/report.py (standard library only), loaded by path: this
    script runs under the image's python3 before anything is installed."""
    name = "h200_first_contact_report"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, REPO / "llama31_405b" / "first_contact" / "report.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def not_started(path: Path, phase: str, reason: str) -> None:
    """The report of a phase `run` did not start: each of its checks "not run" with `reason`."""
    checks = [{"name": n, "status": "not run", "detail": reason, "seconds": 0, "data": {}}
              for n in report_module().PHASES[phase]]
    path.write_text(json.dumps({"meta": {"not_started": reason},
                                "summary": {"passed": 0, "failed": 0, "not run": len(checks)},
                                "checks": checks}, indent=2))


def merge(out: Path, phases: list[str]) -> tuple[dict, list[str]]:
    """One report of the phases' latest reports in `out` (`latest`: a rerun's win): each check
    from the phase that owns it (report.PHASES; "phase P left no report" if P wrote none), the
    common checks (gpu, transformer_engine, ...) from the first phase that ran them."""
    rm = report_module()
    owner = {n: p for p, names in rm.PHASES.items() for n in names}
    files = {p: f for p in phases if (f := latest(out, f"{p}.json")) is not None}
    docs = {p: json.loads(f.read_text()) for p, f in files.items()}
    names = list(dict.fromkeys([*rm.CHECKS, *(c["name"] for d in docs.values()
                                               for c in d["checks"])]))
    checks = {}
    for n in names:
        entries = {p: c for p, d in docs.items() for c in d["checks"] if c["name"] == n}
        p = owner.get(n)
        if p is None:                    # a common check: every phase's process runs it
            ran = [c for c in entries.values() if c["status"] != "not run"]
            checks[n] = (ran or list(entries.values()) or [{
                "name": n, "status": "not run", "seconds": 0, "data": {},
                "detail": "no phase left a report"}])[0]
            continue
        checks[n] = entries.get(p) or {"name": n, "status": "not run", "seconds": 0, "data": {},
                                       "detail": f"phase {p} left no report" if p not in docs
                                       else f"phase {p}'s report lacks it"}
    summary = {s: sum(c["status"] == s for c in checks.values())
               for s in ("passed", "failed", "not run")}
    w = max((len(n) for n in checks), default=0)
    lines = [f"{n:<{w}}  {c['status']:<7}  {c['detail'].splitlines()[0] if c['detail'] else ''}"
             for n, c in checks.items()]
    lines.append(f"{summary['failed']} failed, {summary['passed']} passed, "
                 f"{summary['not run']} not run")
    return {"meta": {p: {"file": files[p].name, **d.get("meta", {})}
                     for p, d in docs.items()}, "summary": summary,
            "checks": list(checks.values())}, lines


def collect(dest: Path, sources: list[Path]) -> list[str]:
    """Copy the files of each folder in `sources` (what device runs brought back, in the order
    they ran) into `dest`, each under the next free tag of its name (`latest` then finds a
    later run's), never over a file there; returns the names written."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sources:
        files = []
        for f in src.iterdir():
            m = re.fullmatch(r"(.+?)(?:\.(\d+))?\.([^.]+)", f.name)
            if f.is_file() and m:
                files.append((int(m.group(2) or 1), m.group(1) + "." + m.group(3), f))
        for _, name, f in sorted(files):
            stem, ext = name.rsplit(".", 1)
            k = max([n for g in dest.iterdir() if (n := tag_number(g.name, stem, ext))]
                    or [0]) + 1
            target = dest / tagged(name, "" if k == 1 else f".{k}")
            shutil.copyfile(f, target)
            written.append(target.name)
    return written


def merge_folders(dest: Path, sources: list[Path], phases: list[str]) -> int:
    """`collect`, then the merged report and summary of everything in `dest`, under the first
    tag neither report.json nor summary.txt has there."""
    for name in collect(dest, sources):
        print(f"  {name}")
    merged, lines = merge(dest, phases)
    tag = run_tag(dest, ["report.json", "summary.txt"])
    (dest / tagged("report.json", tag)).write_text(json.dumps(merged, indent=2))
    (dest / tagged("summary.txt", tag)).write_text("\n".join(lines) + "\n")
    print(f"{dest / tagged('summary.txt', tag)}:\n" + "\n".join(lines))
    return 1 if merged["summary"]["failed"] else 0


def run_tag(out: Path, names) -> str:
    """"" for the first run into `out`, then ".2", ".3", ...: the first tag that none of a
    run's files (`names`, untagged) has there."""
    for n in itertools.count(1):
        tag = "" if n == 1 else f".{n}"
        if not any((out / tagged(name, tag)).exists() for name in names):
            return tag
    raise AssertionError("unreachable")
