"""The inventory of what no test executes (docs/coverage.md).

A *unit* is a function (key `file::Qual.name`), a branch block inside a function or at module
level (`file::Qual.name › if cfg.x:`, `› elif ...:`, `› else of if ...:`, `› except OSError:`,
`› case ...:`, plus ` #2` for the second block with the same header in the same function) or a
whole module (`file::<module>`). Keys carry no line numbers, so they survive edits elsewhere.
Loops, `with` and `finally` are not units: they run whenever the code around them runs.

A unit is *never executed* when none of its statements ran in the combined data of `make
coverage`; only the outermost such unit is reported (a function nobody calls, not each `if`
inside it).

    scripts/coverage_inventory.py                # after `make coverage`: the summary, then the
                                                 # never-executed units docs/coverage.md lacks
                                                 # (paste-ready rows) and its stale entries
    scripts/coverage_inventory.py --write        # the same, and refresh docs/coverage_snapshot.json
    scripts/coverage_inventory.py --check        # no coverage data: what tests/test_coverage_inventory.py
                                                 # checks (snapshot + page + the code as it is now)
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "llama31_405b"
PAGE = REPO / "docs" / "coverage.md"
SNAPSHOT = REPO / "docs" / "coverage_snapshot.json"
DATA = REPO / ".coverage-out" / ".coverage"
SEP = " › "
MODULE = "<module>"
REFRESH = ("run `make coverage`, then `.venv/bin/python scripts/coverage_inventory.py --write` "
           "to refresh docs/coverage_snapshot.json, or list it in docs/coverage.md")


@dataclass
class Unit:
    file: str                      # relative to the repository, posix
    qual: str                      # Qual.name, or <module>
    block: str = ""                # "" for a function or a module, else the header (+ " #n")
    spans: list[tuple[int, int]] = field(default_factory=list)   # the body's line ranges
    parent: str | None = None      # key of the enclosing unit

    @property
    def key(self) -> str:
        return f"{self.file}::{self.qual}" + (SEP + self.block if self.block else "")

    def label(self) -> str:
        """The first cell of the page's row: `Qual.name`, or `Qual.name` › `header` (#n)."""
        if not self.block:
            return f"`{self.qual}`"
        m = re.fullmatch(r"(.*?)( #\d+)?", self.block)
        assert m
        return f"`{self.qual}`{SEP}`{m.group(1)}`{m.group(2) or ''}"


def _header(node: Any, kind: str, owner: str = "") -> str:
    if kind == "if":
        return f"if {ast.unparse(node.test)}:"
    if kind == "elif":
        return f"elif {ast.unparse(node.test)}:"
    if kind == "else":
        return f"else of {owner}"
    if kind == "except":
        t = node.type
        name = node.name
        return ("except" + (f" {ast.unparse(t)}" if t is not None else "")
                + (f" as {name}" if name else "") + ":")
    if kind == "case":
        g = node.guard
        return (f"case {ast.unparse(node.pattern)}"
                + (f" if {ast.unparse(g)}" if g is not None else "") + ":")
    raise ValueError(kind)


def _span(body: list[ast.stmt]) -> tuple[int, int]:
    return body[0].lineno, max(getattr(s, "end_lineno", s.lineno) or s.lineno for s in body)


class _Walker:
    def __init__(self, file: str, lines: list[str]):
        self.file = file
        self.lines = lines
        self.units: list[Unit] = []
        self.functions: dict[str, int] = {}       # a second def of a name (a property's setter)

    def module(self, tree: ast.Module) -> None:
        if not tree.body:
            return
        top = Unit(self.file, MODULE, spans=[_span(tree.body)])
        self.units.append(top)
        self._stmts(tree.body, "", top.key, {}, qual_prefix="")

    def _add(self, unit: Unit) -> Unit:
        self.units.append(unit)
        return unit

    def _block(self, qual: str, parent: str, counts: dict, header: str,
               body: list[ast.stmt]) -> Unit:
        n = counts.get(header, 0) + 1
        counts[header] = n
        block = header + (f" #{n}" if n > 1 else "")
        return self._add(Unit(self.file, qual or MODULE, block, [_span(body)], parent))

    def _stmts(self, body: list[ast.stmt], qual: str, parent: str, counts: dict,
               qual_prefix: str) -> None:
        for s in body:
            self._stmt(s, qual, parent, counts, qual_prefix)

    def _stmt(self, s: ast.stmt, qual: str, parent: str, counts: dict, qual_prefix: str) -> None:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{qual_prefix}{s.name}"
            n = self.functions[name] = self.functions.get(name, 0) + 1
            name += f" #{n}" if n > 1 else ""
            body = s.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str) and len(body) > 1):
                body = body[1:]                                   # the docstring
            fn = self._add(Unit(self.file, name, "", [_span(body)], parent))
            self._stmts(s.body, name, fn.key, {}, qual_prefix=name + ".")
        elif isinstance(s, ast.ClassDef):
            # a class body runs at import with its module or function: its methods are units
            self._stmts(s.body, qual, parent, counts, qual_prefix=f"{qual_prefix}{s.name}.")
        elif isinstance(s, ast.If):
            self._if(s, "if", qual, parent, counts, qual_prefix)
        elif isinstance(s, (ast.Try, ast.TryStar)):
            self._stmts(s.body, qual, parent, counts, qual_prefix)
            for h in s.handlers:
                u = self._block(qual, parent, counts, _header(h, "except"), h.body)
                self._stmts(h.body, qual, u.key, counts, qual_prefix)
            if s.orelse:
                u = self._block(qual, parent, counts, "else of try:", s.orelse)
                self._stmts(s.orelse, qual, u.key, counts, qual_prefix)
            self._stmts(s.finalbody, qual, parent, counts, qual_prefix)
        elif isinstance(s, ast.Match):
            for c in s.cases:
                u = self._block(qual, parent, counts, _header(c, "case"), c.body)
                self._stmts(c.body, qual, u.key, counts, qual_prefix)
        elif isinstance(s, (ast.For, ast.AsyncFor, ast.While)):
            self._stmts(s.body, qual, parent, counts, qual_prefix)
            if s.orelse:
                head = (f"for {ast.unparse(s.target)} in {ast.unparse(s.iter)}:"
                        if not isinstance(s, ast.While) else f"while {ast.unparse(s.test)}:")
                u = self._block(qual, parent, counts, f"else of {head}", s.orelse)
                self._stmts(s.orelse, qual, u.key, counts, qual_prefix)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            self._stmts(s.body, qual, parent, counts, qual_prefix)

    def _if(self, s: ast.If, kind: str, qual: str, parent: str, counts: dict,
            qual_prefix: str) -> None:
        head = _header(s, kind)
        u = self._block(qual, parent, counts, head, s.body)
        self._stmts(s.body, qual, u.key, counts, qual_prefix)
        if len(s.orelse) == 1 and isinstance(s.orelse[0], ast.If) and self._is_elif(s.orelse[0]):
            self._if(s.orelse[0], "elif", qual, parent, counts, qual_prefix)
        elif s.orelse:
            e = self._block(qual, parent, counts, _header(s, "else", head), s.orelse)
            self._stmts(s.orelse, qual, e.key, counts, qual_prefix)

    def _is_elif(self, node: ast.If) -> bool:
        return self.lines[node.lineno - 1].lstrip().startswith("elif")


def units_of_file(path: Path, root: Path) -> list[Unit]:
    text = path.read_text()
    w = _Walker(path.relative_to(root).as_posix(), text.splitlines())
    w.module(ast.parse(text, filename=str(path)))
    return w.units


def package_units(root: Path = REPO, package: str = PACKAGE) -> dict[str, Unit]:
    out: dict[str, Unit] = {}
    for path in sorted((root / package).rglob("*.py")):
        for u in units_of_file(path, root):
            out[u.key] = u
    return out


# --- coverage data -> the never-executed units ---------------------------------------------------

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
        p = u.parent
        if any(q in dead for q in _ancestors(units, p)):
            continue
        dead[key] = len(mine)
    return dead


def _ancestors(units: dict[str, Unit], key: str | None):
    while key is not None:
        yield key
        key = units[key].parent if key in units else None


# --- the page ----------------------------------------------------------------------------------

_FILE = re.compile(r"^#+\s+`([^`]+\.py)`\s*$")
_ROW = re.compile(r"^\|\s*`([^`]+)`(?:\s*›\s*`([^`]+)`( #\d+)?)?\s*\|(.*)$")


@dataclass
class Entry:
    key: str
    why: str
    checked: str


def read_page(text: str) -> dict[str, Entry]:
    """The page's entries: a `### `path.py`` heading, then table rows whose first cell is
    `Qual.name` or `Qual.name` › `header` (` #n` after it for the n-th same header)."""
    out: dict[str, Entry] = {}
    file = None
    for line in text.splitlines():
        m = _FILE.match(line)
        if m:
            file = m.group(1)
            continue
        m = _ROW.match(line)
        if not (m and file):
            continue
        qual, block, n, rest = m.groups()
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", rest)]
        key = f"{file}::{qual}" + (SEP + block.replace("\\|", "|") + (n or "") if block else "")
        out[key] = Entry(key, cells[0] if cells else "", cells[1] if len(cells) > 1 else "")
    return out


def row(u: Unit, why: str = "", checked: str = "") -> str:
    label = u.label().replace("|", "\\|")         # a pipe in a header would end the cell
    return f"| {label} | {why} | {checked} |"


# a first guess for a row, from the block's own source; "TODO" where none fits. Review every
# guess before pasting: the test refuses TODO, not a wrong guess
GUESSES: list[tuple[str, str | None, str | None]] = [
    # CPU code that names CUDA or NVFP4 on purpose: the CUDA stand-ins, the C rounding kernel
    (r"^llama31_405b/(cpu_compat|precision/native)\.py\n", None, None),
    (r"/first_contact/", "GPU only: first-contact's GPU phases",
     "first-contact on the first GPU node; `make typecheck`"),
    (r"CUDAGraph|make_graphed_callables|cuda\.graph|graph_pool", "GPU only: CUDA graphs",
     "`make typecheck`; first-contact `warmup_and_graphs`, `replay_equals_eager`"),
    (r"NVFP4BlockScaling|fp8_autocast|quantized_model_init|fp8_model_init",
     "GPU only: NVFP4 through Transformer Engine",
     "`make typecheck`; first-contact `recipe`"),
    (r"transformer_engine|\bte\.|\bte_[a-z]", "GPU only: Transformer Engine",
     "`make typecheck` (against TE 2.20.2's sources)"),
    (r"(?i)nccl", "GPU only: NCCL", "`make typecheck`; first-contact phase `dp2`"),
    (r"(?i)cuda|\.gpu\b|is_gpu", "GPU only: a CUDA device",
     "`make typecheck`; first-contact `gpu`, `steps`"),
]


def guess(u: Unit, root: Path = REPO) -> tuple[str, str]:
    lines = (root / u.file).read_text().splitlines()
    a, b = u.spans[0]
    text = u.file + "\n" + u.block + "\n" + "\n".join(lines[a - 1:b])
    for pattern, why, checked in GUESSES:
        if re.search(pattern, text):
            if why is None or checked is None:
                break
            return why, checked
    if u.block.startswith("except") or re.search(r"^\s*raise\b", text, re.M) and u.block:
        return "error path no test provokes", "nothing yet"
    return "TODO", "TODO"


def unlisted_rows(keys: list[str], units: dict[str, Unit], guesses: bool = True) -> str:
    """Paste-ready: one heading per file, then its rows (with a first guess of the reason)."""
    out, file = [], None
    for k in sorted(keys, key=lambda k: (units[k].file, k)):
        u = units[k]
        if u.file != file:
            file = u.file
            out += ["", f"### `{file}`", "", "| never executed | why | checked instead |",
                    "|---|---|---|"]
        out.append(row(u, *(guess(u) if guesses else ("TODO", "TODO"))))
    return "\n".join(out)


# --- the check the test makes ------------------------------------------------------------------

def problems(units: dict[str, Unit], snapshot: dict, page: dict[str, Entry]) -> list[str]:
    """What is wrong between the code as it is now, the snapshot and the page."""
    out = []
    known = set(snapshot["known"])
    for key in snapshot["never_executed"]:
        if key in units and key not in page:
            out.append(f"never executed and not listed in docs/coverage.md: {key} "
                       "(scripts/coverage_inventory.py --check prints its row)")
    for key in page:
        if key not in units:
            out.append(f"stale entry in docs/coverage.md: {key} is no longer in the code "
                       "(remove the row, or rename it after the code)")
    for key in units:
        if key not in known and key not in page:
            out.append(f"new since the last `make coverage`, so nothing has measured it: {key}: "
                       + REFRESH)
    for key, e in page.items():
        if key in units and (not e.why or not e.checked or "TODO" in (e.why + e.checked)):
            out.append(f"docs/coverage.md: {key}: give the reason and what checks it instead")
    return out


def source_hashes(root: Path = REPO, package: str = PACKAGE) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / package).rglob("*.py"))}


def load_snapshot(path: Path) -> dict:
    return json.loads(path.read_text())


def snapshot_of(units: dict[str, Unit], dead: dict[str, int], totals: dict) -> dict:
    return {"package": PACKAGE, "lines": totals,
            "never_executed": {k: dead[k] for k in sorted(dead)},
            "known": sorted(units)}


def gpu_share(snapshot: dict, page: dict[str, Entry]) -> tuple[int, int]:
    """(never-executed statements whose reason starts with "GPU", all never-executed ones)."""
    dead = snapshot["never_executed"]
    gpu = sum(n for k, n in dead.items() if k in page and page[k].why.startswith("GPU"))
    return gpu, sum(dead.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA, help="combined coverage data")
    ap.add_argument("--write", action="store_true", help="refresh the snapshot")
    ap.add_argument("--check", action="store_true",
                    help="no coverage data: check snapshot, page and code as the test does")
    ap.add_argument("--record-sources", type=Path, metavar="FILE",
                    help="write the package's source hashes (`make coverage` does, before the "
                         "tests: a file edited during the run is named afterwards)")
    args = ap.parse_args(argv)
    if args.record_sources:
        args.record_sources.write_text(json.dumps(source_hashes(), indent=1) + "\n")
        return 0
    units = package_units()
    page = read_page(PAGE.read_text()) if PAGE.exists() else {}
    if args.check:
        snap = load_snapshot(SNAPSHOT)
        bad = problems(units, snap, page)
        missing = [k for k in snap["never_executed"] if k in units and k not in page]
        new = [k for k in units if k not in set(snap["known"]) and k not in page]
        print("\n".join(bad) or "docs/coverage.md, the snapshot and the code agree")
        if missing or new:
            print("\nrows to fill in and paste into docs/coverage.md:")
            print(unlisted_rows(missing + new, units))
        return 1 if bad else 0
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
    total = sum(len(s) for s, _ in lines.values())
    ran = sum(len(e) for _, e in lines.values())
    snap = snapshot_of(units, dead, {"executed": ran, "total": total})
    gpu, all_dead = gpu_share(snap, page)
    print(f"{ran} of {total} statements of {PACKAGE}/ executed ({100 * ran / total:.1f} %); "
          f"{len(dead)} never-executed units, {all_dead} statements; "
          f"listed as GPU only: {gpu} ({100 * gpu / max(all_dead, 1):.1f} %)")
    unlisted = [k for k in dead if k not in page]
    stale = [k for k in page if k not in units]
    ran_now = [k for k in page if k in units and k not in dead]
    if stale:
        print("\nstale entries in docs/coverage.md (no longer in the code):\n  "
              + "\n  ".join(stale))
    if ran_now:
        print("\nlisted in docs/coverage.md but executed now (remove the row if nothing else "
              "holds it there):\n  " + "\n  ".join(ran_now))
    if unlisted:
        print(f"\n{len(unlisted)} never-executed units docs/coverage.md does not list (review "
              "the guessed reasons, fill in TODO, paste under the file's heading):")
        print(unlisted_rows(unlisted, units))
    if args.write:
        SNAPSHOT.write_text(json.dumps(snap, indent=1) + "\n")
        print(f"\nwrote {SNAPSHOT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
