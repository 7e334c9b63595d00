"""The "checked instead" column of docs/coverage.md: its syntax, and whether what it names
exists (scripts/coverage_inventory.py, tests/test_coverage_inventory.py).

A cell is `nothing yet`, or items separated by `;`, each one of:

    `tests/test_x.py::test_y`            a test: the file holds a collectable `def test_y` (at
    `tests/test_x.py::Cls::test_y`       module level or in the class); `tests/test_x.py` alone
    `tests/test_x.py`                    names the whole file, which must hold a test
    `make typecheck` seed `FILE`         a seeded fault of scripts/typecheck.py SEEDS in FILE
                                         (llama31_405b/... or relative to it), and the seed's
                                         text lies in the row's block
    `make typecheck` on `NAME`, ...      the call, attribute or keyword mypy checks in the block:
                                         every dotted part of each NAME occurs in its source
    first-contact `CHECK`, ...           checks of llama31_405b/first_contact/report.py CHECKS,
                                         or its PHASES
    reading: TEXT                        a reading (against a named source), nothing runs

Any of the first four may end in free text (a parenthesis, "on such a GPU"). What a test or a
check does on the row's code cannot be verified mechanically; the syntax makes the named check
exist, and for the type check, a seed inside the block or a name the block uses.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

NOTHING = "nothing yet"
READING = "reading:"
_TEST = re.compile(r"^`(tests/[^`:]+\.py)((?:::[A-Za-z_]\w*){0,2})(\[[^`]*\])?`(.*)$")
_TYPECHECK = re.compile(r"^`make typecheck`\s+(seed|on)\s+((?:`[^`]+`\s*,?\s*)+)(.*)$")
_FIRST = re.compile(r"^first-contact\s+((?:`[^`]+`\s*,?\s*)+)(.*)$")
_NAMES = re.compile(r"`([^`]+)`")


def split_items(cell: str) -> list[str]:
    """`;`-separated items; a `;` inside backticks or parentheses does not separate."""
    items, cur, tick, depth = [], "", False, 0
    for ch in cell:
        if ch == "`":
            tick = not tick
        elif not tick and ch in "([":
            depth += 1
        elif not tick and ch in ")]":
            depth = max(depth - 1, 0)
        if ch == ";" and not tick and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    items.append(cur.strip())
    return [i for i in items if i]


def reading_only(cell: str) -> bool:
    items = split_items(cell)
    return bool(items) and all(i.startswith(READING) for i in items)


class Known:
    """What exists to be named: tests, first-contact's checks, the type check's seeds."""

    def __init__(self, root: Path):
        self.root = root
        self._tests: dict[str, set[str] | None] = {}
        self._fc: set[str] | None = None
        self._seeds: list[tuple[str, str]] | None = None

    def tests_in(self, rel: str) -> set[str] | None:
        """The collectable test names of a file (`name`, `Class::name`); None: no such file."""
        if rel not in self._tests:
            p = self.root / rel
            if not p.is_file():
                self._tests[rel] = None
            else:
                names: set[str] = set()
                for n in ast.parse(p.read_text()).body:
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                            and n.name.startswith("test"):
                        names.add(n.name)
                    elif isinstance(n, ast.ClassDef) and n.name.startswith("Test"):
                        names |= {f"{n.name}::{m.name}" for m in n.body
                                  if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                                  and m.name.startswith("test")}
                self._tests[rel] = names
        return self._tests[rel]

    def first_contact(self) -> set[str]:
        if self._fc is None:
            self._fc = set()
            tree = ast.parse((self.root / "llama31_405b/first_contact/report.py").read_text())
            for n in tree.body:
                if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name):
                    if n.targets[0].id == "CHECKS":
                        self._fc |= set(ast.literal_eval(n.value))
                    elif n.targets[0].id == "PHASES":
                        self._fc |= set(ast.literal_eval(n.value))
        return self._fc

    def seeds(self) -> list[tuple[str, str]]:
        """(file, text the seed replaces) of each Seed(...) in scripts/typecheck.py SEEDS."""
        if self._seeds is None:
            self._seeds = []
            tree = ast.parse((self.root / "scripts/typecheck.py").read_text())
            for n in ast.walk(tree):
                if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                        and n.func.id == "Seed" and len(n.args) >= 3):
                    try:
                        self._seeds.append((ast.literal_eval(n.args[1]),
                                            ast.literal_eval(n.args[2])))
                    except ValueError:
                        continue
        return self._seeds


def item_problem(item: str, source: str, known: Known) -> str | None:
    """Why the item names no check that exists (None: it does). `source` is the row's block."""
    if item.startswith(READING):
        return None if item[len(READING):].strip() else "`reading:` names nothing read"
    if item == NOTHING:
        return f"`{NOTHING}` stands alone in its cell"
    m = _TEST.match(item)
    if m:
        rel, node = m.group(1), m.group(2).lstrip(":")
        names = known.tests_in(rel)
        if names is None:
            return f"no test file {rel}"
        if not node:
            return None if names else f"{rel} holds no test"
        return None if node in names else f"no test {node} in {rel}"
    m = _TYPECHECK.match(item)
    if m:
        kind, named = m.group(1), _NAMES.findall(m.group(2))
        if kind == "seed":
            for f in named:
                rel = f if f.startswith("llama31_405b/") else f"llama31_405b/{f}"
                texts = [old for file, old in known.seeds() if file == rel]
                if not texts:
                    return f"no seed of scripts/typecheck.py SEEDS in {rel}"
                if not any(old.strip() in source for old in texts):
                    return f"the seed in {rel} lies outside this block"
            return None
        words = set(re.findall(r"[A-Za-z_]\w*", source))
        for name in named:
            lost = [p for p in name.split(".") if p not in words]
            if lost:
                return f"`{name}` does not occur in the block: the type check has nothing there"
        return None
    m = _FIRST.match(item)
    if m:
        lost = [c for c in _NAMES.findall(m.group(1)) if c not in known.first_contact()]
        return (f"first-contact has no check {', '.join(lost)} (first_contact/report.py CHECKS)"
                if lost else None)
    if item.startswith("`make typecheck`"):
        return ("`make typecheck` needs a seed inside the block (seed `FILE`) or the name it "
                "checks there (on `NAME`)")
    return "not a check: a backticked test id, `make typecheck` seed/on, first-contact, reading:"


def cell_problems(cell: str, source: str, known: Known) -> list[str]:
    items = split_items(cell)
    if items == [NOTHING]:
        return []
    if not items:
        return ["no check named"]
    return [f"{i!r}: {p}" for i in items if (p := item_problem(i, source, known))]
