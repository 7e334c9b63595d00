"""Names held in strings that reach Transformer Engine 2.20.2 or megatron-core 0.19.2, checked
against their pinned sources (tests/test_pinned_names.py; docs/typecheck.md). mypy sees none of
them: an environment variable name, an enum member looked up by name, an attribute reached with
getattr/hasattr/setattr, a key of one of TE's dicts, a dotted module path.

- `nvte_uses` / `nvte_problems`: every NVTE_* name in the project's code, configs and scripts is
  read somewhere in TE's PyTorch-side Python (transformer_engine/{pytorch,common,debug}, its
  top-level modules; not jax, a framework the project does not run) or in megatron-core, or is
  in CPP_ONLY with where TE's C++ reads it.
- `enum_lookups`: every `Enum[name]` / `getattr(Enum, name)` on a TE or megatron enum, its names
  traced to string constants (a literal, or the list a project function returns), is a member.
- `attribute_uses` / `attribute_problems`: every getattr/hasattr/setattr/delattr with a literal
  name in llama31_405b/ is classified in ATTRIBUTES; those on TE or megatron objects name the
  class or module that must define them, and do.
- `dict_key_problems`: the keys the project reads from TE's own dicts (DICT_KEYS) are string
  constants of the TE module that fills them.
- `dotted_problems`: a string constant that is a dotted `transformer_engine.*` / `megatron.*`
  path names a module, or a name defined in one.
"""
from __future__ import annotations

import ast
import difflib
import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

from .source_index import PACKAGE, REPO, Module, SourceTree, own_nodes, resolve

NVTE = re.compile(r"\bNVTE_[A-Za-z0-9_*]*[A-Za-z0-9*]")
SCANNED = ("llama31_405b", "configs", "scripts", "bench", "run_and_time.sh", "Dockerfile")
TEXT_SUFFIXES = {".py", ".toml", ".yaml", ".yml", ".sh", ".awk", ".cfg", ".txt", ".md"}
TE_PARTS = ("transformer_engine/pytorch", "transformer_engine/common", "transformer_engine/debug")

# Knobs TE 2.20.2 reads only in its C++ library (libtransformer_engine.so, not in the wheel's
# Python): the test cannot see them read, so each stands here with where it is read.
CPP_ONLY = {
    "NVTE_NORM_FWD_USE_CUDNN": "read only in C++: libtransformer_engine.so "
                               "transformer_engine::normalization::use_cudnn_norm_fwd",
    "NVTE_NORM_BWD_USE_CUDNN": "read only in C++: libtransformer_engine.so "
                               "transformer_engine::normalization::use_cudnn_norm_bwd",
}


def project_texts() -> dict[str, str]:
    """relative path -> text of every file NVTE names are looked for in."""
    out = {}
    for top in SCANNED:
        p = REPO / top
        files = sorted(p.rglob("*")) if p.is_dir() else [p]
        for f in files:
            if f.is_file() and (f.suffix in TEXT_SUFFIXES or f.name == "Dockerfile"
                                or f == REPO / "run_and_time.sh"):
                out[f.relative_to(REPO).as_posix()] = f.read_text(errors="replace")
    return out


def nvte_uses(texts: dict[str, str]) -> dict[str, list[str]]:
    """NVTE name (or pattern with `*`) -> ["file:line", ...]."""
    out: dict[str, list[str]] = {}
    for rel, text in texts.items():
        for i, line in enumerate(text.splitlines(), 1):
            for m in NVTE.finditer(line):
                out.setdefault(m.group(0), []).append(f"{rel}:{i}")
    return out


def nvte_read_by(root: Path, parts: tuple[str, ...] | None = None) -> set[str]:
    """Every NVTE_* token in the .py files of `root` (restricted to `parts` and the top-level
    modules of `root`'s package)."""
    files = []
    if parts is None:
        files = list(root.rglob("*.py"))
    else:
        for part in parts:
            files += (root / part).rglob("*.py")
        files += (root / parts[0]).parent.glob("*.py")
    return {m.group(0) for f in files for m in NVTE.finditer(f.read_text(errors="replace"))}


def nvte_problems(uses: dict[str, list[str]], te: set[str], mcore: set[str],
                  cpp_only: dict[str, str] = CPP_ONLY) -> list[str]:
    known = te | mcore | set(cpp_only)
    out = []
    for name, where in sorted(uses.items()):
        if "*" in name:
            if not fnmatch.filter(sorted(known), name):
                out.append(f"{where[0]}: {name} matches no NVTE name Transformer Engine 2.20.2 "
                           "or megatron-core 0.19.2 reads")
            continue
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1)
        out += [f"{w}: {name} is read by neither Transformer Engine 2.20.2's Python (pytorch, "
                "common, debug) nor megatron-core 0.19.2, and CPP_ONLY does not list it"
                + (f"; did you mean {close[0]}?" if close else "") for w in where]
    for name in sorted(cpp_only):
        if name in te:
            out.append(f"CPP_ONLY: {name} is read in TE 2.20.2's Python after all: remove it")
        if name not in uses:
            out.append(f"CPP_ONLY: {name} is no longer used by the project: remove it")
    return out


# -- enum members looked up by name --------------------------------------------------------------

def _is_enum(mod: Module, cls: ast.ClassDef) -> bool:
    return any((b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")).endswith(
        ("Enum", "Flag")) for b in cls.bases)


def enum_members(cls: ast.ClassDef) -> set[str]:
    out = set()
    for s in cls.body:
        targets = s.targets if isinstance(s, ast.Assign) else \
            [s.target] if isinstance(s, ast.AnnAssign) else []
        out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return out


def _strings(e: ast.expr, tree: SourceTree, mod: Module, scope, lost: list[str]):
    """(name, module, line, function) of the string constants `e` can be: a literal, a list or
    tuple of them, or what a project function returns."""
    if isinstance(e, ast.Constant) and isinstance(e.value, str):
        return [(e.value, mod, e.lineno)]
    if isinstance(e, (ast.List, ast.Tuple, ast.Set)):
        return [x for el in e.elts for x in _strings(el, tree, mod, scope, lost)]
    if isinstance(e, ast.IfExp):
        return _strings(e.body, tree, mod, scope, lost) + \
            _strings(e.orelse, tree, mod, scope, lost)
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add):
        return _strings(e.left, tree, mod, scope, lost) + \
            _strings(e.right, tree, mod, scope, lost)
    if isinstance(e, ast.Call):
        target = resolve(e.func, mod, scope)
        hit = tree.split(target) if target and target.startswith(PACKAGE + ".") else None
        if hit and hit[1] in hit[0].functions:
            fn = hit[0].functions[hit[1]]
            return [x for r in own_nodes(fn) if isinstance(r, ast.Return) and r.value
                    for x in _strings(r.value, tree, hit[0], fn, lost)]
    if isinstance(e, ast.Name) and scope is not None:
        loops = [n.iter for n in ast.walk(scope) if isinstance(n, (ast.For, ast.comprehension))
                 and isinstance(n.target, ast.Name) and n.target.id == e.id]
        if loops:
            return [x for it in loops for x in _strings(it, tree, mod, scope, lost)]
    lost.append(f"{mod.rel}:{getattr(e, 'lineno', '?')}: cannot trace the names in "
                f"`{ast.unparse(e)}` to string constants")
    return []


def enum_lookups(project: SourceTree, libs: dict[str, SourceTree]) -> tuple[list[str], list[str]]:
    """(one line per lookup site found, problems): every `X[name]` and `getattr(X, name)` where
    X is an enum class of TE or megatron-core (`libs`: top-level package -> its sources)."""
    sites, out = [], []
    for mod in project.modules(PACKAGE):
        for fname, scope in [("<module>", None), *mod.functions.items()]:
            for n in own_nodes(scope if scope is not None else mod.tree):
                if isinstance(n, ast.Subscript):
                    base, index = n.value, n.slice
                elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                      and n.func.id in ("getattr", "hasattr") and len(n.args) >= 2):
                    base, index = n.args[0], n.args[1]
                else:
                    continue
                dotted = resolve(base, mod, scope)
                lib = libs.get(dotted.split(".")[0]) if dotted else None
                if dotted is None or lib is None:
                    continue
                where = f"{mod.rel}:{n.lineno} ({fname})"
                lost: list[str] = []
                if dotted.endswith(".__dict__") and isinstance(n, ast.Subscript):
                    # a class's own attribute, read from its __dict__ by name
                    cls = dotted[:-len(".__dict__")]
                    for name, smod, line in _strings(index, project, mod, scope, lost):
                        if not defines(lib, cls, name):
                            out.append(f"{smod.rel}:{line}: '{name}' is not defined by {cls} "
                                       f"in the pinned sources, read at {where}")
                    out += lost
                    continue
                hit = lib.find_class(dotted)
                if hit is None or not _is_enum(*hit):
                    if isinstance(n, ast.Subscript):
                        out.append(f"{mod.rel}:{n.lineno}: {fname}: `{ast.unparse(n)}`: "
                                   f"{dotted} is no enum class of the pinned sources")
                    continue
                sites.append(f"{where}: {dotted}")
                members = enum_members(hit[1])
                for name, smod, line in _strings(index, project, mod, scope, lost):
                    if name not in members:
                        close = difflib.get_close_matches(name, sorted(members), n=1)
                        out.append(f"{smod.rel}:{line}: '{name}' is not a member of {dotted} "
                                   f"(members: {', '.join(sorted(members))}), looked up at "
                                   f"{where}" + (f"; did you mean '{close[0]}'?" if close else ""))
                out += [f"{x} (looked up in {dotted} at {where})" for x in lost]
    return sites, out


# -- attributes reached by name ------------------------------------------------------------------

@dataclass(frozen=True)
class Pinned:
    """Defined in the pinned sources: `where` is a class (its bases followed) or a module."""
    where: str


@dataclass(frozen=True)
class Elsewhere:
    """Not a TE or megatron-core attribute: why."""
    reason: str


def _targets(t: ast.expr):
    if isinstance(t, (ast.Tuple, ast.List)):
        for el in t.elts:
            yield from _targets(el)
    elif isinstance(t, ast.Starred):
        yield from _targets(t.value)
    else:
        yield t


def _defined_in(node: ast.AST, attr: str, body_level: list[ast.stmt]) -> bool:
    for s in body_level:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                s.name == attr:
            return True
        if isinstance(s, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name.split(".")[0]) == attr for a in s.names):
            return True
    for n in ast.walk(node):
        targets = n.targets if isinstance(n, ast.Assign) else \
            [n.target] if isinstance(n, (ast.AnnAssign, ast.AugAssign)) else []
        for t in (x for tt in targets for x in _targets(tt)):
            if isinstance(t, ast.Attribute) and t.attr == attr:
                return True
            if isinstance(t, ast.Name) and t.id == attr and (n in body_level):
                return True
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr"
                and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant)
                and n.args[1].value == attr):
            return True
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)   # torch's own ways
                and n.func.attr in ("add_module", "register_buffer", "register_parameter",
                                    "register_module") and n.args
                and isinstance(n.args[0], ast.Constant) and n.args[0].value == attr):
            return True
    return False


def defines(tree: SourceTree, where: str, attr: str, _depth: int = 0) -> bool | None:
    """Whether class or module `where` of `tree` defines `attr` (a class: in its body, as
    `self.attr = ...` in a method, or in a base class of the pinned sources); None when
    `where` is neither."""
    hit = tree.find_class(where)
    if hit is not None:
        mod, cls = hit
        if _defined_in(cls, attr, cls.body):
            return True
        for b in cls.bases:
            base = resolve(b, mod, None)
            if base and _depth < 10 and tree.find_class(base) is not None:
                if defines(tree, base, attr, _depth + 1):
                    return True
        return False
    module = tree.module(where)
    if module is None:
        return None
    return _defined_in(module.tree, attr, module.tree.body)


def attribute_uses(project: SourceTree) -> dict[str, list[str]]:
    """attribute -> ["file:line (function)", ...] of every getattr/hasattr/setattr/delattr
    with a literal name in the package."""
    out: dict[str, list[str]] = {}
    for mod in project.modules(PACKAGE):
        for fname, scope in [("<module>", None), *mod.functions.items()]:
            for n in own_nodes(scope if scope is not None else mod.tree):
                if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                        and n.func.id in ("getattr", "hasattr", "setattr", "delattr")
                        and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant)
                        and isinstance(n.args[1].value, str)):
                    out.setdefault(n.args[1].value, []).append(
                        f"{mod.rel}:{n.lineno} ({fname})")
    return out


def attribute_problems(uses: dict[str, list[str]], table: dict, libs: dict[str, SourceTree]
                       ) -> list[str]:
    out = []
    for attr, where in sorted(uses.items()):
        if attr not in table:
            close = difflib.get_close_matches(attr, sorted(table), n=1)
            out += [f"{w}: '{attr}' is reached by name but tests/helpers/pinned_attributes.py "
                    "ATTRIBUTES does not classify it (a TE or megatron-core class or module "
                    "that defines it, or why it is neither)"
                    + (f"; did you mean '{close[0]}'?" if close else "") for w in where]
            continue
        for place in table[attr]:
            if isinstance(place, Elsewhere):
                continue
            lib = libs[place.where.split(".")[0]]
            ok = defines(lib, place.where, attr)
            if ok is None:
                out.append(f"ATTRIBUTES['{attr}']: {place.where} is no class or module of the "
                           "pinned sources")
            elif not ok:
                out += [f"{w}: '{attr}' is not defined by {place.where} in the pinned sources "
                        "(Transformer Engine 2.20.2 / megatron-core 0.19.2)" for w in where]
    out += [f"ATTRIBUTES['{a}']: no longer reached by name in the package: remove it"
            for a in sorted(set(table) - set(uses))]
    return out


# -- keys of TE's dicts, dotted paths ------------------------------------------------------------

def read_keys(mod: Module, function: str) -> list[tuple[str, int]]:
    """String keys `function` reads: `.get("k")`, `x["k"]`, and the literals of a tuple or list
    a `for` walks."""
    fn = mod.functions[function]
    out = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                n.func.attr == "get" and n.args:
            cands = [n.args[0]]
        elif isinstance(n, ast.Subscript):
            cands = [n.slice]
        elif isinstance(n, (ast.For, ast.comprehension)) and isinstance(n.iter, (ast.Tuple,
                                                                                 ast.List)):
            cands = list(n.iter.elts)
        else:
            continue
        out += [(c.value, c.lineno) for c in cands
                if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return out


def string_constants(mod: Module) -> set[str]:
    return {n.value for n in ast.walk(mod.tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def dict_key_problems(project: SourceTree, table: dict, libs: dict[str, SourceTree]
                      ) -> list[str]:
    out = []
    for (rel, function), (where, what) in table.items():
        dotted = rel[:-3].replace("/", ".")
        mod = project.module(dotted)
        if mod is None or function not in mod.functions:
            out.append(f"DICT_KEYS: {rel} {function} no longer exists: update the table")
            continue
        lib_mod = libs[where.split(".")[0]].module(where)
        if lib_mod is None:
            out.append(f"DICT_KEYS: {where} is no module of the pinned sources")
            continue
        have = string_constants(lib_mod)
        keys = read_keys(mod, function)
        if not keys:
            out.append(f"{rel}: {function}: reads no key of {what} any more: update DICT_KEYS")
        for k, line in keys:
            if k not in have:
                close = difflib.get_close_matches(k, sorted(have), n=1)
                out.append(f"{rel}:{line}: {function}: '{k}' is no key of {what} in {where} "
                           "(Transformer Engine 2.20.2)"
                           + (f"; did you mean '{close[0]}'?" if close else ""))
    return out


DOTTED = re.compile(r"(transformer_engine|megatron)(\.[A-Za-z_]\w*)+")


def dotted_problems(project: SourceTree, libs: dict[str, SourceTree]) -> list[str]:
    out = []
    for mod in project.modules(PACKAGE):
        for n in ast.walk(mod.tree):
            if not (isinstance(n, ast.Constant) and isinstance(n.value, str)
                    and DOTTED.fullmatch(n.value)):
                continue
            lib = libs[n.value.split(".")[0]]
            hit = lib.split(n.value)
            ok = hit is not None and (not hit[1] or "." not in hit[1] and (
                hit[1] in hit[0].classes or hit[1] in hit[0].functions
                or defines(lib, hit[0].name, hit[1])))
            if not ok:
                out.append(f"{mod.rel}:{n.lineno}: '{n.value}' names no module (or name in "
                           "one) of the pinned sources")
    return out
