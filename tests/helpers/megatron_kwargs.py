"""The keywords the project hands megatron-core in dicts (`TransformerConfig(**kw)`,
`DistributedDataParallelConfig(**kw)`, `initialize_model_parallel(**kw)`), collected from the
source with `ast` in every branch, GPU-only ones included, and compared with what megatron-core
0.19.2 accepts (tests/test_megatron_keywords.py; docs/typecheck.md).

`call_sites(tree)` finds every call in llama31_405b/ that passes `**expr` to a callable of
megatron-core or Transformer Engine (resolved through the imports), and `keys_of` collects the
keys `expr` can hold: keywords of `dict(...)`, string keys of dict literals, `kw["k"] = ...`,
`kw.update(...)` / `kw.setdefault("k", ...)` / `kw |= {...}`, and the keys returned by the
project's functions whose result is merged (`**f(...)`, `kw.update(f(...))`). Whatever cannot
be followed (a non-constant key, a parameter, a comprehension) is reported as unresolved rather
than skipped, so no key escapes the check silently."""
from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib
import inspect
from dataclasses import dataclass, field

from .source_index import PACKAGE, Module, SourceTree, own_nodes, resolve

# Every call `dataclasses.replace(obj, **kw)` in the package, by file and function, with the
# class of `obj`: a megatron-core class is checked like a call of it; None is a project
# dataclass, outside this check (the callee cannot be told from the call, hence the table: a new
# call fails the test until it is listed)
REPLACE_TARGETS: dict[tuple[str, str], str | None] = {
    ("llama31_405b/rehearse/rank.py", "_transformer_config"):
        "megatron.core.transformer.TransformerConfig",
    ("llama31_405b/planner/calibrate/summary.py", "median_summary"): None,   # its Summary
    ("llama31_405b/planner/calibrate/joint.py", "mean"): None,   # its Fitted
}


@dataclass(frozen=True)
class Key:
    name: str
    file: str
    function: str
    line: int


@dataclass
class Site:
    file: str
    function: str
    line: int
    target: str                   # dotted name of the callee
    keys: list[Key] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)


class _Collector:
    def __init__(self, tree: SourceTree):
        self.tree = tree
        self.keys: list[Key] = []
        self.unresolved: list[str] = []
        self._seen: set[tuple[str, str, str]] = set()

    def _where(self, mod: Module, fname: str, node: ast.AST) -> str:
        return f"{mod.rel}:{getattr(node, 'lineno', '?')}: {fname}"

    def key(self, name: str, mod: Module, fname: str, node: ast.AST) -> None:
        self.keys.append(Key(name, mod.rel, fname, getattr(node, "lineno", 0)))

    def lost(self, what: str, mod: Module, fname: str, node: ast.AST) -> None:
        self.unresolved.append(f"{self._where(mod, fname, node)}: cannot follow the keys of "
                               f"{what} `{ast.unparse(node)}`")

    def expr(self, e: ast.expr, mod: Module, fname: str, scope: ast.AST | None) -> None:
        if isinstance(e, ast.Dict):
            for k, v in zip(e.keys, e.values):
                if k is None:
                    self.expr(v, mod, fname, scope)
                elif isinstance(k, ast.Constant) and isinstance(k.value, str):
                    self.key(k.value, mod, fname, k)
                else:
                    self.lost("a dict key", mod, fname, k)
        elif isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "dict":
            for a in e.args:
                self.expr(a, mod, fname, scope)
            self.keywords(e.keywords, mod, fname, scope)
        elif isinstance(e, ast.Call):
            self.call_result(e, mod, fname, scope)
        elif isinstance(e, ast.Name):
            self.name(e, mod, fname, scope)
        elif isinstance(e, ast.IfExp):
            self.expr(e.body, mod, fname, scope)
            self.expr(e.orelse, mod, fname, scope)
        elif isinstance(e, ast.BinOp) and isinstance(e.op, ast.BitOr):
            self.expr(e.left, mod, fname, scope)
            self.expr(e.right, mod, fname, scope)
        else:
            self.lost("the expression", mod, fname, e)

    def keywords(self, kws: list[ast.keyword], mod: Module, fname: str, scope) -> None:
        for kw in kws:
            if kw.arg is None:
                self.expr(kw.value, mod, fname, scope)
            else:
                self.key(kw.arg, mod, fname, kw)

    def call_result(self, call: ast.Call, mod: Module, fname: str, scope) -> None:
        """The keys of the dicts a project function returns."""
        target = resolve(call.func, mod, scope)
        hit = self.tree.split(target) if target and target.startswith(PACKAGE + ".") else None
        if hit is None or hit[1] not in hit[0].functions:
            self.lost("the result of", mod, fname, call)
            return
        fmod, fn = hit[0], hit[1]
        mark = (fmod.rel, fn, "<return>")
        if mark in self._seen:
            return
        self._seen.add(mark)
        node = fmod.functions[fn]
        returns = [n for n in own_nodes(node) if isinstance(n, ast.Return)]
        if not returns:
            self.lost("a function without return", mod, fname, call)
        for r in returns:
            if r.value is None:
                self.lost("a bare return in", fmod, fn, r)
            else:
                self.expr(r.value, fmod, fn, node)

    def name(self, n: ast.Name, mod: Module, fname: str, scope, origin: str = "") -> None:
        """Every key put into the dict variable `n` in its function (or module; `origin`: the
        function that named it there)."""
        body = scope if scope is not None else mod.tree
        mark = (mod.rel, fname, n.id)
        if mark in self._seen:
            return
        self._seen.add(mark)
        found = False
        for s in own_nodes(body):
            if isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = s.targets if isinstance(s, ast.Assign) else [s.target]
                for t in targets:
                    if isinstance(t, ast.Name) and t.id == n.id and s.value is not None:
                        found = True
                        self.expr(s.value, mod, fname, scope)
                    elif (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                          and t.value.id == n.id):
                        found = True
                        if isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str):
                            self.key(t.slice.value, mod, fname, t)
                        else:
                            self.lost("a subscript", mod, fname, t)
            elif (isinstance(s, ast.Call) and isinstance(s.func, ast.Attribute)
                  and isinstance(s.func.value, ast.Name) and s.func.value.id == n.id):
                if s.func.attr == "update":
                    found = True
                    for a in s.args:
                        self.expr(a, mod, fname, scope)
                    self.keywords(s.keywords, mod, fname, scope)
                elif s.func.attr == "setdefault":
                    found = True
                    k = s.args[0] if s.args else None
                    if isinstance(k, ast.Constant) and isinstance(k.value, str):
                        self.key(k.value, mod, fname, k)
                    else:
                        self.lost("setdefault's key", mod, fname, s)
        if not found and scope is not None:       # a module-level dict (or an imported one)
            imported = mod.imports(scope).get(n.id)
            if imported and imported.startswith(PACKAGE + "."):
                hit = self.tree.split(imported)
                if hit and hit[1] and "." not in hit[1]:
                    self.name(ast.Name(hit[1], lineno=n.lineno), hit[0], "<module>", None,
                              origin=fname)
                    return
            self.name(n, mod, "<module>", None, origin=fname)
            return
        if not found:
            self.lost("the name", mod, origin or fname, n)


def keys_of(tree: SourceTree, e: ast.expr, mod: Module, fname: str,
            scope: ast.AST | None) -> tuple[list[Key], list[str]]:
    c = _Collector(tree)
    c.expr(e, mod, fname, scope)
    return c.keys, c.unresolved


def call_sites(tree: SourceTree) -> tuple[list[Site], list[str]]:
    """Every call of a megatron-core or Transformer Engine callable with `**expr` in the
    package, with the keys `expr` can hold; and the `dataclasses.replace(..., **kw)` calls that
    REPLACE_TARGETS does not list."""
    sites, unlisted = [], []
    for mod in tree.modules(PACKAGE):
        scopes = [("<module>", None)] + list(mod.functions.items())
        for fname, scope in scopes:
            for call in own_nodes(scope if scope is not None else mod.tree):
                if not isinstance(call, ast.Call) or all(k.arg for k in call.keywords):
                    continue
                target = resolve(call.func, mod, scope)
                if target == "dataclasses.replace" or (
                        isinstance(call.func, ast.Name) and call.func.id == "replace"
                        and target is None):
                    if (mod.rel, fname) not in REPLACE_TARGETS:
                        unlisted.append(f"{mod.rel}:{call.lineno}: {fname}: "
                                        f"`{ast.unparse(call)}` is not in REPLACE_TARGETS")
                        continue
                    target = REPLACE_TARGETS[(mod.rel, fname)]
                    if target is None:
                        continue
                elif not target or not target.startswith(("megatron.", "transformer_engine.")):
                    continue
                site = Site(mod.rel, fname, call.lineno, target)
                for kw in call.keywords:
                    if kw.arg is None:
                        keys, lost = keys_of(tree, kw.value, mod, fname, scope)
                        site.keys += keys
                        site.unresolved += lost
                    else:
                        site.keys.append(Key(kw.arg, mod.rel, fname, kw.value.lineno))
                sites.append(site)
    return sites, unlisted


def accepted(target: str) -> tuple[set[str], str]:
    """The keyword names the installed `target` accepts (a dataclass's init fields, bases
    included, or the signature's parameters), and what they are, for messages. Raises
    TypeError for a callee taking **kwargs (nothing to compare with) or not importable."""
    mod, _, attr = target.rpartition(".")
    obj = getattr(importlib.import_module(mod), attr)
    if dataclasses.is_dataclass(obj):
        return {f.name for f in dataclasses.fields(obj) if f.init}, "a field of"
    params = inspect.signature(obj).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        raise TypeError(f"{target} takes **kwargs: its keywords cannot be checked by name")
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}, \
        "a parameter of"


def problems(sites: list[Site]) -> list[str]:
    """One line per key a site's callee does not accept (naming the file and function that
    put the key in, the key, the call and the closest accepted name), and per unresolved
    source of keys."""
    out, cache = [], {}
    for s in sites:
        if s.target not in cache:
            cache[s.target] = accepted(s.target)
        names, what = cache[s.target]
        for k in s.keys:
            if k.name not in names:
                close = difflib.get_close_matches(k.name, sorted(names), n=1)
                out.append(f"{k.file}:{k.line}: {k.function}: '{k.name}' is not {what} "
                           f"{s.target} (megatron-core 0.19.2), passed at {s.file}:{s.line} "
                           f"({s.function})" + (f"; did you mean '{close[0]}'?" if close else ""))
        out += [f"{u} (passed to {s.target} at {s.file}:{s.line})" for u in s.unresolved]
    return out


# The functions that build megatron's keyword dicts today, by the file and function that write
# the keys: each must give at least one key, so that a refactor the collector cannot follow
# (keys built some other way) fails here instead of leaving the check with nothing to check.
PRODUCERS = (("llama31_405b/model/builder.py", "transformer_config"),
             ("llama31_405b/model/builder.py", "_recompute_kwargs"),
             ("llama31_405b/model/builder.py", "ddp_config"),
             ("llama31_405b/precision/te_recipe.py", "transformer_config_kwargs"),
             ("llama31_405b/parallel/setup.py", "megatron_parallel_kwargs"),
             ("llama31_405b/rehearse/rank.py", "<module>"))


def silent_producers(sites: list[Site], producers=PRODUCERS) -> list[str]:
    """The PRODUCERS that gave no key to any call site."""
    found = {(k.file, k.function) for s in sites for k in s.keys}
    return [f"{f}: {fn}: the collector found no keyword it passes to megatron-core; the code "
            "changed shape: make tests/helpers/megatron_kwargs.py follow it, or update PRODUCERS"
            for f, fn in producers if (f, fn) not in found]
