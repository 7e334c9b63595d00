"""The package's import graph, read from the source with `ast` (nothing is imported): no cycle
between modules, counting imports inside functions (a lazy import hides a cycle, it does not
remove it) and leaving out `if TYPE_CHECKING:` blocks; and no upward import between packages
(LAYERS: a package imports only packages of a lower or equal layer, and packages of one layer do
not import each other in a circle).

Layer names that do not exist (yet) are ignored; a top-level package or module missing from
LAYERS fails the test, so each new one gets a place."""
from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "llama31_405b"

LAYERS = {
    # facts about machines, the known-warning filters, how a failure ends (failures)
    "systems": 0, "known_warnings": 0, "failures": 0,
    # the one owner of writing a result (exclusive creation, moves that cannot replace): the
    # standard library only, so every layer may use it
    "outputs": 0,
    # the typed config tree and its rules; the process setup the config implies
    "config": 1, "cpu_compat": 1, "gloo_workers": 1,
    # one concern each, on top of the config
    "mlperf": 2, "precision": 2, "planner": 2, "data": 2,
    "model": 3, "parallel": 3,
    "checkpoint": 4,
    # what runs: training, packaging a submission, the launch plan and log check
    "train": 5, "submission": 5, "launch": 5,
    "rehearse": 6, "profile": 6,
    # first contact with a GPU: the training path and its profile, checked on a slice
    "first_contact": 7,
    # the command line, and the entry point
    "cli": 8, "__main__": 9,
}

# exact edges let through while a change that removes them is under way (none today); delete an
# entry once its edge is gone
PENDING: set[tuple[str, str]] = set()


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    out = {}
    for p in root.rglob("*.py"):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for b in node.body for n in ast.walk(b)}
    return skip


def import_graph(root: Path = PKG) -> dict[str, set[str]]:
    """module -> the package modules it imports (at module level or inside functions). An
    import of `pkg.mod` counts as an edge to `pkg.mod`; `from pkg import name` to `pkg.name`
    when that is a module, else to `pkg`. A module's own ancestor packages are left out (Python
    initialises them before the module in any case)."""
    mods = _modules(root)
    top = root.name

    def known(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in mods:
            parts.pop()
        return ".".join(parts) if parts else None

    edges: dict[str, set[str]] = defaultdict(set)
    for mod, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                subs = [f"{prefix}.{a.name}" for a in node.names]
                names = [n for n in subs if n in mods]
                if len(names) < len(subs):
                    names.append(prefix)
            for name in names:
                target = known(name) if name.split(".")[0] == top else None
                if target and target != mod and not mod.startswith(target + "."):
                    edges[mod].add(target)
    for mod in mods:
        edges.setdefault(mod, set())
    return dict(edges)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _package(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "(package __init__)"


def package_edges(edges: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(package, package) -> the module imports behind that edge."""
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for a, targets in edges.items():
        for b in targets:
            pa, pb = _package(a), _package(b)
            if pa != pb and "(package __init__)" not in (pa, pb):
                out[(pa, pb)].append(f"{a} -> {b}")
    return out


def upward(edges: dict[str, set[str]], layers: dict[str, int] = LAYERS) -> list[str]:
    return [f"{pa} (layer {layers[pa]}) imports {pb} (layer {layers[pb]}): {', '.join(sorted(why))}"
            for (pa, pb), why in sorted(package_edges(edges).items())
            if pa in layers and pb in layers and layers[pb] > layers[pa]]


# ---------------------------------------------------------------- the repository


def test_every_package_has_a_layer():
    packages = {_package(m) for m in _repo_graph()} - {"(package __init__)"}
    assert packages - LAYERS.keys() == set(), "add these to LAYERS in tests/test_import_graph.py"


@cache
def _repo_graph() -> dict[str, set[str]]:
    return {a: {b for b in targets if (a, b) not in PENDING}
            for a, targets in import_graph().items()}


def test_no_import_cycle_between_modules():
    assert cycles(_repo_graph()) == []


def test_no_import_cycle_between_packages():
    pkg_graph: dict[str, set[str]] = defaultdict(set)
    for pa, pb in package_edges(_repo_graph()):
        pkg_graph[pa].add(pb)
    assert cycles(dict(pkg_graph)) == []


def test_no_upward_import():
    assert upward(_repo_graph()) == []


# ---------------------------------------------------------------- the checks themselves


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "llama31_405b"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    for d in {(root / n).parent for n in files} - {root}:
        (d / "__init__.py").touch()
    return root


def test_a_lazy_import_cycle_is_found_and_type_checking_is_not(tmp_path):
    root = _tree(tmp_path, {
        "config/schema.py": "def derived():\n    from .derived import derive\n",
        "config/derived.py": "from .schema import Config\n",
        "parallel/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                         "    from .b import B\n",
        "parallel/b.py": "from . import a\n"})
    edges = import_graph(root)
    assert edges["llama31_405b.parallel.b"] == {"llama31_405b.parallel.a"}
    assert cycles(edges) == [["llama31_405b.config.derived", "llama31_405b.config.schema"]]


def test_launch_importing_cli_is_upward(tmp_path):
    root = _tree(tmp_path, {"launch/logcheck.py": "def f():\n    from ..cli import main\n",
                            "cli/__init__.py": "from ..launch import logcheck\n",
                            "cli/main.py": ""})
    edges = import_graph(root)
    assert upward(edges) == [
        "launch (layer 5) imports cli (layer 8): llama31_405b.launch.logcheck -> "
        "llama31_405b.cli.main"]
