"""Python sources read with `ast` for the checks of names the type checker cannot see
(tests/test_megatron_keywords.py, tests/test_pinned_names.py; docs/typecheck.md): the project's
package, and the pinned sources of Transformer Engine 2.20.2 (fetched into .cache/te-2.20.2/ by
scripts/fetch_te_sources.py) and megatron-core 0.19.2 (installed in the venv).

A `SourceTree` maps dotted module names to parsed files under one root; `resolve` turns a name
or attribute chain used in a function into the dotted name it refers to, through the imports of
the function and of its module (relative imports included)."""
from __future__ import annotations

import ast
import fcntl
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "llama31_405b"
TE_VERSION = "2.20.2"
TE_ROOT = REPO / ".cache" / f"te-{TE_VERSION}"

FuncDef = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Module:
    name: str          # dotted
    rel: str           # path shown in reports (relative to the repository, or to the root)
    text: str
    is_package: bool
    tree: ast.Module = field(init=False)
    functions: dict[str, FuncDef] = field(init=False)   # qualified within the module: "C.f"
    classes: dict[str, ast.ClassDef] = field(init=False)

    def __post_init__(self) -> None:
        self.tree = ast.parse(self.text, filename=self.rel)
        self.functions, self.classes = {}, {}
        self._imports: dict[int, dict[str, str]] = {}
        self._index(self.tree, "")

    def _index(self, node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[prefix + child.name] = child
                self._index(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                self.classes[prefix + child.name] = child
                self._index(child, prefix + child.name + ".")
            elif not isinstance(child, ast.expr):
                self._index(child, prefix)

    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]

    def imports(self, scope: ast.AST | None = None) -> dict[str, str]:
        """alias -> dotted name, for the module's top-level imports and those inside `scope`
        (a function), the latter winning."""
        key = id(scope)
        if key not in self._imports:
            self._imports[key] = self._read_imports(scope)
        return self._imports[key]

    def _read_imports(self, scope: ast.AST | None) -> dict[str, str]:
        out: dict[str, str] = {}
        top = [n for n in self.tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        top += [n for s in self.tree.body if isinstance(s, (ast.If, ast.Try))
                for n in ast.walk(s) if isinstance(n, (ast.Import, ast.ImportFrom))]
        inner = [n for n in ast.walk(scope) if isinstance(n, (ast.Import, ast.ImportFrom))] \
            if scope is not None else []
        for n in top + inner:
            if isinstance(n, ast.Import):
                for a in n.names:
                    if a.asname:
                        out[a.asname] = a.name
                    else:
                        out[a.name.split(".")[0]] = a.name.split(".")[0]
            else:
                base = self.absolute(n.module, n.level)
                for a in n.names:
                    out[a.asname or a.name] = f"{base}.{a.name}" if base else a.name
        return out

    def absolute(self, module: str | None, level: int) -> str:
        if not level:
            return module or ""
        parts = self.package().split(".")
        base = ".".join(parts[:len(parts) - (level - 1)])
        return f"{base}.{module}" if module else base


_PARSED: dict[tuple[str, str], Module] = {}   # parsed once per process, whatever the tree


class SourceTree:
    """The modules of one or more top-level packages under `root`, parsed on first use.
    `overrides` (path relative to the repository -> text) stands in for files on disk: the
    seeded-fault tests check a copy with one fault in it."""

    def __init__(self, root: Path, *, rel_to: Path | None = None,
                 overrides: dict[str, str] | None = None):
        self.root, self.rel_to = root, rel_to or root
        self.overrides = dict(overrides or {})
        self._cache: dict[str, Module | None] = {}

    def file_of(self, dotted: str) -> tuple[Path, bool] | None:
        base = self.root.joinpath(*dotted.split("."))
        for path, pkg in ((base.with_suffix(".py"), False), (base / "__init__.py", True)):
            rel = self._rel(path)
            if rel in self.overrides or path.is_file():
                return path, pkg
        return None

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.rel_to).as_posix()

    def module(self, dotted: str) -> Module | None:
        if dotted not in self._cache:
            found = self.file_of(dotted)
            mod = None
            if found:
                path, pkg = found
                rel = self._rel(path)
                text = self.overrides.get(rel)
                text = text if text is not None else path.read_text()
                if (rel, text) not in _PARSED:
                    _PARSED[(rel, text)] = Module(dotted, rel, text, pkg)
                mod = _PARSED[(rel, text)]
            self._cache[dotted] = mod
        return self._cache[dotted]

    def modules(self, package: str) -> list[Module]:
        """Every module of `package` (a folder under the root), sorted by path."""
        out = []
        folder = self.root / package.replace(".", "/")
        extra = [self.rel_to / r for r in self.overrides
                 if r.endswith(".py") and (self.rel_to / r).is_relative_to(folder)]
        for path in sorted(set(folder.rglob("*.py")) | set(extra)):
            parts = path.relative_to(self.root).with_suffix("").parts
            dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            mod = self.module(dotted)
            if mod is not None:
                out.append(mod)
        return out

    def split(self, dotted: str) -> tuple[Module, str] | None:
        """(module, rest) for the longest prefix of `dotted` that is a module here."""
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            mod = self.module(".".join(parts[:i]))
            if mod is not None:
                return mod, ".".join(parts[i:])
        return None

    def find_class(self, dotted: str, _depth: int = 0) -> tuple[Module, ast.ClassDef] | None:
        """The class `dotted` names, following re-exports (`from .x import C`)."""
        hit = self.split(dotted)
        if hit is None or not hit[1] or _depth > 8:
            return None
        mod, rest = hit
        if rest in mod.classes:
            return mod, mod.classes[rest]
        head, _, tail = rest.partition(".")
        target = mod.imports().get(head)
        if target:
            return self.find_class(f"{target}.{tail}" if tail else target, _depth + 1)
        return None


def resolve(expr: ast.expr, mod: Module, scope: ast.AST | None) -> str | None:
    """The dotted name `expr` (a name or an attribute chain) refers to in `scope` of `mod`:
    through an import, or a function or class of `mod` itself; None otherwise."""
    if isinstance(expr, ast.Attribute):
        base = resolve(expr.value, mod, scope)
        return f"{base}.{expr.attr}" if base else None
    if isinstance(expr, ast.Name):
        imported = mod.imports(scope).get(expr.id)
        if imported:
            return imported
        if expr.id in mod.functions or expr.id in mod.classes:
            return f"{mod.name}.{expr.id}"
    return None



def own_nodes(scope: ast.AST):
    """The nodes of `scope`'s body, not descending into nested functions or classes."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        n = stack.pop()
        yield n
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(n))


def project_tree(overrides: dict[str, str] | None = None) -> SourceTree:
    return SourceTree(REPO, overrides=overrides)


def megatron_tree() -> SourceTree:
    """megatron-core's installed sources (the venv's 0.19.2, pinned by constraints/cpu.txt)."""
    spec = importlib.util.find_spec("megatron.core")
    assert spec is not None and spec.origin, "megatron-core is not installed (make setup)"
    site = Path(spec.origin).parents[2]
    return SourceTree(site)


class TESourcesMissing(RuntimeError):
    pass


def te_tree() -> SourceTree:
    """Transformer Engine 2.20.2's Python sources, fetched (once, under a lock shared by
    pytest's workers) by scripts/fetch_te_sources.py when this clone does not have them yet."""
    lock = TE_ROOT.parent / f"{TE_ROOT.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        spec = importlib.util.spec_from_file_location(
            "fetch_te_sources", REPO / "scripts" / "fetch_te_sources.py")
        assert spec is not None and spec.loader is not None
        fetch = importlib.util.module_from_spec(spec)
        sys.modules.setdefault("fetch_te_sources", fetch)
        spec.loader.exec_module(fetch)
        if not fetch.is_complete(TE_ROOT):
            try:
                fetch.fetch(TE_ROOT)
            except fetch.FetchError as e:
                raise TESourcesMissing(
                    f"Transformer Engine {TE_VERSION}'s sources are not in {TE_ROOT} and could "
                    f"not be fetched: {e}. Run `make typecheck` (or "
                    "`.venv/bin/python scripts/fetch_te_sources.py`) where PyPI is reachable"
                ) from e
    return SourceTree(TE_ROOT)
