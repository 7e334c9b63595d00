"""The inventory of what no test executes (docs/coverage.md).

Units and statements are scripts/coverage_units.py's: a unit is a function (`file::Qual.name`),
a branch block (`file::Qual.name › if cfg.x:`, ` #n` for a repeated header) or a module
(`file::<module>`); a statement is keyed `unit key » its first line` (` #n` for a repeat). Keys
carry no line numbers, so they survive edits elsewhere. Loops, `with` and `finally` are not units.

A unit is *never executed* when none of its statements ran in the combined data of `make
coverage`; only the outermost such unit is reported. A statement is *never executed* when it
did not run although its unit did (a loop body's `continue`, the return after the last `if`);
only the outermost such statement is reported, and an `if` line whose block is reported is not.

    scripts/coverage_inventory.py                # after `make coverage`: the summary, then the
                                                 # never-executed units and statements
                                                 # docs/coverage.md lacks (paste-ready rows)
    scripts/coverage_inventory.py --write        # the same, and refresh docs/coverage_snapshot.json
    scripts/coverage_inventory.py --check        # no coverage data: what tests/test_coverage_inventory.py
                                                 # checks (snapshot + page + the code as it is now)
    scripts/coverage_inventory.py --strict       # `make coverage` runs it last: exit 1 when the
                                                 # page lacks a never-executed unit or statement of
                                                 # the data, or lists one no longer in the code
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coverage_checked import Known, cell_problems, reading_only  # noqa: E402
from coverage_units import (MODULE, SEP, STMT_SEP, Stmt, Unit, ancestors,  # noqa: E402,F401
                            device_ifexps, own_statement_counts, package_walk,
                            statement_counts, units_of_file)
from coverage_page import (IFEXP_SECTION, READING_LIST, Entry, ifexp_row,  # noqa: E402,F401
                           read_ifexps, read_page, read_reading_list, row, stmt_row)
import coverage_units  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "llama31_405b"
PAGE = REPO / "docs" / "coverage.md"
SNAPSHOT = REPO / "docs" / "coverage_snapshot.json"
DATA = REPO / ".coverage-out" / ".coverage"
REFRESH = ("run `make coverage`, then `.venv/bin/python scripts/coverage_inventory.py --write` "
           "to refresh docs/coverage_snapshot.json, or list it in docs/coverage.md")


def package_units(root: Path = REPO, package: str = PACKAGE) -> dict[str, Unit]:
    return coverage_units.package_units(root, package)


def package_statements(root: Path = REPO, package: str = PACKAGE):
    return package_walk(root, package)


# --- coverage data -> the never-executed units and statements ---------------------------------

def measured_lines(data_file: Path, root: Path, files: list[str]) -> dict[str, tuple[set, set]]:
    """file -> (statement lines, executed lines), by coverage.py's own analysis."""
    import coverage
    cov = coverage.Coverage(data_file=str(data_file), config_file=str(root / "pyproject.toml"))
    cov.load()
    out = {}
    for f in files:
        _, statements, _excluded, missing, _ = cov.analysis2(str(root / f))
        out[f] = (set(statements), set(statements) - set(missing))
    return out


def never_executed(units: dict[str, Unit], lines: dict[str, tuple[set, set]]) -> dict[str, int]:
    """key -> statement count, for the outermost units none of whose statements ran."""
    dead: dict[str, int] = {}
    for key, u in units.items():                  # parents come before their children
        statements, executed = lines.get(u.file, (set(), set()))
        mine = {ln for a, b in u.spans for ln in range(a, b + 1) if ln in statements}
        if not mine or mine & executed:
            continue
        if any(q in dead for q in ancestors(units, u.parent)):
            continue
        dead[key] = len(mine)
    return dead


def never_executed_statements(units: dict[str, Unit], stmts: dict[str, Stmt],
                              lines: dict[str, tuple[set, set]], dead: dict[str, int]
                              ) -> tuple[dict[str, int], dict[str, list[int]]]:
    """(key -> missed lines it holds, for the outermost never-executed statements of executed
    units; file -> missed lines neither a unit nor a statement accounts for)."""
    covered: dict[str, set[int]] = {}
    for k in dead:
        u = units[k]
        c = covered.setdefault(u.file, set())
        c.update(ln for a, b in u.spans for ln in range(a, b + 1))
        if u.head:
            c.add(u.head)                         # an `except`'s or `case`'s own line
    out: dict[str, int] = {}
    for key, st in stmts.items():
        file = st.unit.split("::", 1)[0]
        statements, executed = lines.get(file, (set(), set()))
        missed = statements - executed
        if st.line not in missed or st.line in covered.get(file, set()):
            continue
        if any(a in dead for a in ancestors(units, st.unit)):
            continue
        if any(ln in missed for ln in st.outer) or any(o in dead for o in st.opens):
            covered.setdefault(file, set()).add(st.line)   # in a listed statement, or the
            continue                                      # `if` of a listed block
        out[key] = len([ln for ln in range(st.line, st.end + 1) if ln in missed])
        covered.setdefault(file, set()).update(range(st.line, st.end + 1))
    unexplained = {f: sorted((s - e) - covered.get(f, set())) for f, (s, e) in lines.items()}
    return out, {f: v for f, v in unexplained.items() if v}


# a first guess for a row, from the block's own source; "TODO" where none fits. Review every
# guess before pasting: the test refuses TODO, not a wrong guess
GUESSES: list[tuple[str, str | None, str | None]] = [
    # CPU code that names CUDA or NVFP4 on purpose: the CUDA stand-ins, the C rounding kernel
    (r"^llama31_405b/(cpu_compat|precision/native)\.py\n", None, None),
    (r"/first_contact/", "GPU only: first-contact's GPU phases", "TODO: first-contact `CHECK`"),
    (r"CUDAGraph|make_graphed_callables|cuda\.graph|graph_pool", "GPU only: CUDA graphs",
     "first-contact `warmup_and_graphs`, `replay_equals_eager`"),
    (r"NVFP4BlockScaling|fp8_autocast|quantized_model_init|fp8_model_init",
     "GPU only: NVFP4 through Transformer Engine", "first-contact `recipe`"),
    (r"transformer_engine|\bte\.|\bte_[a-z]", "GPU only: Transformer Engine",
     "TODO: `make typecheck` on `NAME` (a TE call the block makes), first-contact `CHECK`"),
    (r"(?i)nccl", "GPU only: NCCL", "first-contact `dp2`"),
    (r"(?i)cuda|\.gpu\b|is_gpu", "GPU only: a CUDA device", "first-contact `gpu`, `steps`"),
]


def unit_source(u: Unit, root: Path = REPO) -> str:
    """The block's header and body: what a row's check must be about."""
    lines = (root / u.file).read_text().splitlines()
    return "\n".join([u.qual, u.block] + [ln for a, b in u.spans for ln in lines[a - 1:b]])


def guess(u: Unit, root: Path = REPO, extra: str = "") -> tuple[str, str]:
    text = u.file + "\n" + extra + "\n" + unit_source(u, root)
    for pattern, why, checked in GUESSES:
        if re.search(pattern, text):
            if why is None or checked is None:
                break
            return why, checked
    if u.block.startswith("except") or re.search(r"^\s*raise\b", text, re.M) and u.block:
        return "error path no test provokes", "nothing yet"
    return "TODO", "TODO"


def unlisted_rows(keys: list[str], units: dict[str, Unit], guesses: bool = True,
                  stmts: dict[str, Stmt] | None = None) -> str:
    """Paste-ready: one heading per file, then its rows (with a first guess of the reason); the
    statements of one unit share a row."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        if k in units:
            groups.setdefault(k, [])
        elif stmts and k in stmts:
            groups.setdefault(stmts[k].unit + STMT_SEP, []).append(stmts[k].text)
    out, file = [], None
    for g in sorted(groups, key=lambda g: (units[g.removesuffix(STMT_SEP)].file, g)):
        u = units[g.removesuffix(STMT_SEP)]
        if u.file != file:
            file = u.file
            out += ["", f"### `{file}`", "", "| never executed | why | checked instead |",
                    "|---|---|---|"]
        texts = groups[g]
        cells = guess(u, extra="\n".join(texts)) if guesses else ("TODO", "TODO")
        out.append(stmt_row(u, texts, *cells) if g.endswith(STMT_SEP) else row(u, *cells))
    return "\n".join(out)


# --- the check the test makes ------------------------------------------------------------------

def problems(units: dict[str, Unit], snapshot: dict, page: dict[str, Entry],
             stmts: dict[str, Stmt] | None = None, known: Known | None = None,
             reading: list[str] | None = None, ifexps: tuple[dict, dict] | None = None,
             root: Path = REPO) -> list[str]:
    """What is wrong between the code as it is now, the snapshot and the page. `stmts`: also the
    statements and the listed blocks' counts; `known`: also the checks the rows name;
    `reading`: also the list of reading-only rows; `ifexps`: (code's, page's) conditional
    expressions on the device."""
    out = []
    known_keys = set(snapshot["known"])
    live = set(units) | set(stmts or ())
    for key in snapshot["never_executed"]:
        if key in units and key not in page:
            out.append(f"never executed and not listed in docs/coverage.md: {key} "
                       "(scripts/coverage_inventory.py --check prints its row)")
    for key in snapshot.get("never_executed_statements", {}) if stmts is not None else ():
        if stmts is not None and key in stmts and key not in page:
            out.append(f"never-executed statement not listed in docs/coverage.md: {key} "
                       "(scripts/coverage_inventory.py --check prints its row)")
    for key in page:
        if key not in live:
            out.append(f"stale entry in docs/coverage.md: {key} is no longer in the code "
                       "(remove the row, or rename it after the code)")
    for key in units:
        if key not in known_keys and key not in page:
            out.append(f"new since the last `make coverage`, so nothing has measured it: {key}: "
                       + REFRESH)
    if stmts is not None:
        counts = snapshot.get("counts", {})
        dead = [k for k in counts if k in units and k in snapshot["never_executed"]]
        holders = [k for k in counts if k in units and k not in snapshot["never_executed"]]
        now = {**statement_counts(units, stmts, dead), **own_statement_counts(stmts, holders)}
        for key, n in sorted(now.items()):
            if n > counts[key]:
                out.append(f"code added inside a listed block: {key} holds {n} statements, "
                           f"{counts[key]} when measured: " + REFRESH.split(", or")[0])
    rows: dict[str, Entry] = {}
    for key, e in page.items():
        if key in live:
            rows.setdefault(e.row, e)
    if ifexps is not None:
        code, listed = ifexps
        out += [f"conditional expression on the device not listed under \"{IFEXP_SECTION[3:]}\" "
                f"in docs/coverage.md: {k}" for k in code if k not in listed]
        out += [f"stale entry under \"{IFEXP_SECTION[3:]}\": {k} is no longer in the code"
                for k in listed if k not in code]
        rows.update((k, e) for k, e in listed.items() if k in code)
    for key, e in sorted(rows.items()):
        if not e.why or not e.checked or "TODO" in (e.why + e.checked):
            out.append(f"docs/coverage.md: {key}: give the reason and what checks it instead")
        elif known is not None:
            u = units.get(key.removesuffix(STMT_SEP.rstrip()).rstrip())
            src = unit_source(u, root) if u else _ifexp_source(key, root)
            out += [f"docs/coverage.md: {key}: checked instead: {p}"
                    for p in cell_problems(e.checked, src, known)]
    if reading is not None:
        want = sorted(k for k, e in rows.items() if reading_only(e.checked))
        for k in sorted(set(want) - set(reading)):
            out.append(f"checked only by reading, missing from \"{READING_LIST[3:]}\": {k}")
        for k in sorted(set(reading) - set(want)):
            out.append(f"under \"{READING_LIST[3:]}\" but not a reading-only row: {k}")
    return out


def _ifexp_source(key: str, root: Path) -> str:
    return key.split(STMT_SEP, 1)[1]


def check_all(root: Path = REPO, page_text: str | None = None,
              snapshot: dict | None = None) -> list[str]:
    """Everything tests/test_coverage_inventory.py checks, on the code as it is now."""
    units, stmts = package_walk(root, PACKAGE)
    text = (root / "docs" / "coverage.md").read_text() if page_text is None else page_text
    snap = load_snapshot(root / "docs" / "coverage_snapshot.json") if snapshot is None else snapshot
    return problems(units, snap, read_page(text), stmts, Known(root), read_reading_list(text),
                    (device_ifexps(root, PACKAGE), read_ifexps(text)), root)


def source_hashes(root: Path = REPO, package: str = PACKAGE) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / package).rglob("*.py"))}


def load_snapshot(path: Path) -> dict:
    return json.loads(path.read_text())


def snapshot_of(units: dict[str, Unit], dead: dict[str, int], totals: dict,
                stmts: dict[str, Stmt] | None = None,
                dead_stmts: dict[str, int] | None = None) -> dict:
    snap = {"package": PACKAGE, "lines": totals,
            "never_executed": {k: dead[k] for k in sorted(dead)},
            "known": sorted(units)}
    if stmts is not None and dead_stmts is not None:
        holders = sorted({stmts[k].unit for k in dead_stmts})
        snap["never_executed_statements"] = {k: dead_stmts[k] for k in sorted(dead_stmts)}
        snap["counts"] = dict(sorted({**statement_counts(units, stmts, sorted(dead)),
                                      **own_statement_counts(stmts, holders)}.items()))
    return snap


def gpu_share(snapshot: dict, page: dict[str, Entry]) -> tuple[int, int]:
    """(never-executed statements whose reason starts with "GPU", all never-executed ones)."""
    dead = {**snapshot["never_executed"], **snapshot.get("never_executed_statements", {})}
    gpu = sum(n for k, n in dead.items() if k in page and page[k].why.startswith("GPU"))
    return gpu, sum(dead.values())


def _print_check(units, stmts, snap, text) -> int:
    page = read_page(text)
    bad = check_all(page_text=text, snapshot=snap)
    missing = [k for k in snap["never_executed"] if k in units and k not in page]
    missing += [k for k in snap.get("never_executed_statements", {})
                if k in stmts and k not in page]
    new = [k for k in units if k not in set(snap["known"]) and k not in page]
    print("\n".join(bad) or "docs/coverage.md, the snapshot and the code agree")
    if missing or new:
        print("\nrows to fill in and paste into docs/coverage.md:")
        print(unlisted_rows(missing + new, units, stmts=stmts))
    listed = read_ifexps(text)
    lacking = [k for k in device_ifexps(REPO, PACKAGE) if k not in listed]
    if lacking:
        print(f"\nrows for \"{IFEXP_SECTION[3:]}\":\n"
              + "\n".join(ifexp_row(k, "TODO", "TODO") for k in lacking))
    rows = {e.row: e for e in {**page, **listed}.values() if e.key in units or e.key in stmts
            or e.key in listed}
    if any(READING_LIST[3:] in b for b in bad):
        print(f"\n{READING_LIST[3:]} (as the page must have it):\n" + "\n".join(
            f"- `{k}`" for k, e in sorted(rows.items()) if reading_only(e.checked)))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA, help="combined coverage data")
    ap.add_argument("--write", action="store_true", help="refresh the snapshot")
    ap.add_argument("--check", action="store_true",
                    help="no coverage data: check snapshot, page and code as the test does")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when the data holds a never-executed unit or statement the page "
                         "does not list, or the page an entry no longer in the code (.ci/run)")
    ap.add_argument("--record-sources", type=Path, metavar="FILE",
                    help="write the package's source hashes (`make coverage` does, before the "
                         "tests: a file edited during the run is named afterwards)")
    args = ap.parse_args(argv)
    if args.record_sources:
        args.record_sources.write_text(json.dumps(source_hashes(), indent=1) + "\n")
        return 0
    units, stmts = package_walk(REPO, PACKAGE)
    text = PAGE.read_text() if PAGE.exists() else ""
    page = read_page(text)
    if args.check:
        return _print_check(units, stmts, load_snapshot(SNAPSHOT), text)
    if not args.data.exists():
        print(f"no coverage data at {args.data}: run `make coverage` first", file=sys.stderr)
        return 2
    files = sorted({u.file for u in units.values()})
    recorded = args.data.parent / "sources.json"
    if recorded.exists():
        before, now = json.loads(recorded.read_text()), source_hashes()
        edited = sorted(f for f in set(before) | set(now) if before.get(f) != now.get(f))
        if edited:
            print("edited since the tests ran (their lines may not match the data: run `make "
                  "coverage` again before --write):\n  " + "\n  ".join(edited) + "\n")
    lines = measured_lines(args.data, REPO, files)
    dead = never_executed(units, lines)
    dead_stmts, unexplained = never_executed_statements(units, stmts, lines, dead)
    total = sum(len(s) for s, _ in lines.values())
    ran = sum(len(e) for _, e in lines.values())
    snap = snapshot_of(units, dead, {"executed": ran, "total": total}, stmts, dead_stmts)
    gpu, all_dead = gpu_share(snap, page)
    print(f"{ran} of {total} statements of {PACKAGE}/ executed ({100 * ran / total:.1f} %); "
          f"{len(dead)} never-executed units ({sum(dead.values())} statements) and "
          f"{len(dead_stmts)} never-executed statements in executed units; "
          f"listed as GPU only: {gpu} of {all_dead} ({100 * gpu / max(all_dead, 1):.1f} %)")
    for f, lns in sorted(unexplained.items()):
        print(f"  missed lines of {f} no unit or statement accounts for: {lns}")
    unlisted = [k for k in [*dead, *dead_stmts] if k not in page]
    stale = [k for k in page if k not in units and k not in stmts]
    ran_now = [k for k in page if (k in units or k in stmts) and k not in dead
               and k not in dead_stmts]
    if stale:
        print("\nstale entries in docs/coverage.md (no longer in the code):\n  "
              + "\n  ".join(stale))
    if ran_now:
        print("\nlisted in docs/coverage.md but executed now (remove the row if nothing else "
              "holds it there):\n  " + "\n  ".join(ran_now))
    if unlisted:
        print(f"\n{len(unlisted)} never-executed units and statements docs/coverage.md does not "
              "list (review the guessed reasons, fill in TODO, paste under the file's heading):")
        print(unlisted_rows(unlisted, units, stmts=stmts))
    if args.write:
        SNAPSHOT.write_text(json.dumps(snap, indent=1) + "\n")
        print(f"\nwrote {SNAPSHOT.relative_to(REPO)}")
    if args.strict and (unlisted or stale):
        print(f"\nthe inventory is not current: {len(unlisted)} unlisted, {len(stale)} stale "
              "(docs/coverage.md, \"Refreshing the snapshot\")", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
