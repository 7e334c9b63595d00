"""The inventory's units and statements (scripts/coverage_inventory.py, docs/coverage.md): an
`ast` walk of a package, keyed without line numbers.

A *unit* is a function (`file::Qual.name`), a branch block (`file::Qual.name › if cfg.x:`,
`› elif ...:`, `› else of if ...:`, `› except OSError:`, `› case ...:`, ` #n` for the n-th
block with the same header in the same function) or a whole module (`file::<module>`).
A *statement* belongs to its innermost unit and is keyed `unit key » text`: the text is the
statement's first line after `ast.unparse` (a compound statement's header), cut at TEXT_MAX
characters, with ` #n` for the n-th statement of the same text in the same unit.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEP = " › "
STMT_SEP = " » "
MODULE = "<module>"
TEXT_MAX = 100


@dataclass
class Unit:
    file: str                      # relative to the repository, posix
    qual: str                      # Qual.name, or <module>
    block: str = ""                # "" for a function or a module, else the header (+ " #n")
    spans: list[tuple[int, int]] = field(default_factory=list)   # the body's line ranges
    parent: str | None = None      # key of the enclosing unit
    head: int = 0                  # the header's line (an `except`'s or `case`'s own line)

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


@dataclass
class Stmt:
    unit: str                      # the innermost unit's key
    text: str                      # first line of ast.unparse (+ " #n")
    line: int
    end: int
    outer: list[int] = field(default_factory=list)   # first lines of the enclosing statements
    opens: list[str] = field(default_factory=list)   # unit keys whose header this statement is

    @property
    def key(self) -> str:
        return self.unit + STMT_SEP + self.text


def stmt_text(s: ast.stmt, lines: list[str]) -> str:
    if isinstance(s, ast.If):
        word = "elif" if lines[s.lineno - 1].lstrip().startswith("elif") else "if"
        text = f"{word} {ast.unparse(s.test)}:"
    elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        text = ast.unparse(s).splitlines()[len(s.decorator_list)]
    else:
        text = ast.unparse(s).splitlines()[0]
    text = text.replace("`", "'")                 # a key holds no backtick: the page quotes it
    return text if len(text) <= TEXT_MAX else text[:TEXT_MAX - 1] + "…"


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
        self.stmts: list[Stmt] = []
        self.functions: dict[str, int] = {}       # a second def of a name (a property's setter)
        self.outer: list[int] = []                # the enclosing statements' lines

    def module(self, tree: ast.Module) -> None:
        if not tree.body:
            return
        top = Unit(self.file, MODULE, spans=[_span(tree.body)])
        self.units.append(top)
        self._stmts(tree.body, "", top.key, {}, qual_prefix="")
        seen: dict[tuple[str, str], int] = {}
        for st in self.stmts:                     # " #n" for repeated text in one unit
            n = seen[(st.unit, st.text)] = seen.get((st.unit, st.text), 0) + 1
            st.text += f" #{n}" if n > 1 else ""

    def _add(self, unit: Unit) -> Unit:
        self.units.append(unit)
        return unit

    def _block(self, qual: str, parent: str, counts: dict, header: str,
               body: list[ast.stmt], head: int = 0) -> Unit:
        n = counts.get(header, 0) + 1
        counts[header] = n
        block = header + (f" #{n}" if n > 1 else "")
        return self._add(Unit(self.file, qual or MODULE, block, [_span(body)], parent, head))

    def _record(self, s: ast.stmt, parent: str) -> Stmt:
        st = Stmt(parent, stmt_text(s, self.lines), s.lineno, s.end_lineno or s.lineno,
                  list(self.outer))
        self.stmts.append(st)
        return st

    def _stmts(self, body: list[ast.stmt], qual: str, parent: str, counts: dict,
               qual_prefix: str) -> None:
        for s in body:
            st = self._record(s, parent)
            self.outer.append(s.lineno)
            n = len(self.units)
            self._stmt(s, qual, parent, counts, qual_prefix)
            self.outer.pop()
            if isinstance(s, ast.If):                    # the `if` line of its own block
                st.opens = [self.units[n].key]

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
            self._stmts(body, name, fn.key, {}, qual_prefix=name + ".")
        elif isinstance(s, ast.ClassDef):
            # a class body runs at import with its module or function: its methods are units
            self._stmts(s.body, qual, parent, counts, qual_prefix=f"{qual_prefix}{s.name}.")
        elif isinstance(s, ast.If):
            self._if(s, "if", qual, parent, counts, qual_prefix)
        elif isinstance(s, (ast.Try, ast.TryStar)):
            self._stmts(s.body, qual, parent, counts, qual_prefix)
            for h in s.handlers:
                u = self._block(qual, parent, counts, _header(h, "except"), h.body, h.lineno)
                self._stmts(h.body, qual, u.key, counts, qual_prefix)
            if s.orelse:
                u = self._block(qual, parent, counts, "else of try:", s.orelse)
                self._stmts(s.orelse, qual, u.key, counts, qual_prefix)
            self._stmts(s.finalbody, qual, parent, counts, qual_prefix)
        elif isinstance(s, ast.Match):
            for c in s.cases:
                u = self._block(qual, parent, counts, _header(c, "case"), c.body,
                                c.pattern.lineno)
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
            elif_ = s.orelse[0]
            st = self._record(elif_, parent)             # the elif's test: the enclosing unit's
            n = len(self.units)
            self._if(elif_, "elif", qual, parent, counts, qual_prefix)
            st.opens = [self.units[n].key]
        elif s.orelse:
            e = self._block(qual, parent, counts, _header(s, "else", head), s.orelse)
            self._stmts(s.orelse, qual, e.key, counts, qual_prefix)

    def _is_elif(self, node: ast.If) -> bool:
        return self.lines[node.lineno - 1].lstrip().startswith("elif")


def walk_file(path: Path, root: Path) -> tuple[list[Unit], list[Stmt]]:
    text = path.read_text()
    w = _Walker(path.relative_to(root).as_posix(), text.splitlines())
    w.module(ast.parse(text, filename=str(path)))
    return w.units, w.stmts


def units_of_file(path: Path, root: Path) -> list[Unit]:
    return walk_file(path, root)[0]


def package_walk(root: Path, package: str) -> tuple[dict[str, Unit], dict[str, Stmt]]:
    units: dict[str, Unit] = {}
    stmts: dict[str, Stmt] = {}
    for path in sorted((root / package).rglob("*.py")):
        us, ss = walk_file(path, root)
        units.update((u.key, u) for u in us)
        stmts.update((s.key, s) for s in ss)
    return units, stmts


def package_units(root: Path, package: str) -> dict[str, Unit]:
    return package_walk(root, package)[0]


def ancestors(units: dict[str, Unit], key: str | None):
    while key is not None:
        yield key
        key = units[key].parent if key in units else None


def statement_counts(units: dict[str, Unit], stmts: dict[str, Stmt],
                     keys: list[str]) -> dict[str, int]:
    """key -> how many statements the unit holds: for the listed units, recorded in the snapshot
    so that code added inside one fails the test. A unit's count takes in its nested units."""
    want = set(keys)
    out = {k: 0 for k in keys}
    for st in stmts.values():
        for a in ancestors(units, st.unit):
            if a in want:
                out[a] += 1
    return out


def own_statement_counts(stmts: dict[str, Stmt], keys: list[str]) -> dict[str, int]:
    """key -> how many statements lie directly in the unit (not in a block nested in it)."""
    out = {k: 0 for k in keys}
    for st in stmts.values():
        if st.unit in out:
            out[st.unit] += 1
    return out


# --- conditional expressions on the device --------------------------------------------------------
# coverage.py records lines, and both arms of `a if gpu else b` sit on the line that ran: it cannot
# say that the GPU arm never ran. So every conditional expression whose test names the device is
# listed on the page by this scan instead (docs/coverage.md, "Conditional expressions").

DEVICE_NAME = re.compile(r"^(gpu|te|cuda|nccl|is_gpu)$|^(gpu|te|cuda|nccl)_|_(gpu|te|cuda|nccl)$"
                         r"|^cuda")


def _test_names(test: ast.expr) -> set[str]:
    return ({n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
            | {n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute)})


class _IfExps(ast.NodeVisitor):
    def __init__(self, file: str):
        self.file, self.scope = file, [MODULE]
        self.found: list[tuple[str, int]] = []       # (key, line)
        self.functions: dict[str, int] = {}

    def _def(self, node: Any, is_class: bool) -> None:
        prefix = "" if self.scope[-1] == MODULE else self.scope[-1] + "."
        name = prefix + node.name
        if not is_class:
            n = self.functions[name] = self.functions.get(name, 0) + 1
            name += f" #{n}" if n > 1 else ""
        self.scope.append(name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_FunctionDef(self, node: Any) -> None:
        self._def(node, False)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: Any) -> None:
        self._def(node, True)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        if any(DEVICE_NAME.search(n) for n in _test_names(node.test)):
            text = ast.unparse(node).replace("`", "'")
            text = text if len(text) <= TEXT_MAX else text[:TEXT_MAX - 1] + "…"
            self.found.append((f"{self.file}::{self.scope[-1]}{STMT_SEP}{text}", node.lineno))
        self.generic_visit(node)


def device_ifexps(root: Path, package: str) -> dict[str, int]:
    """key (`file::Qual » a if gpu else b`, ` #n` for a repeat) -> line, for every conditional
    expression of the package whose test names the device (DEVICE_NAME)."""
    out: dict[str, int] = {}
    for path in sorted((root / package).rglob("*.py")):
        v = _IfExps(path.relative_to(root).as_posix())
        v.visit(ast.parse(path.read_text()))
        for key, line in v.found:
            k, n = key, 1
            while k in out:
                n += 1
                k = f"{key} #{n}"
            out[k] = line
    return out
