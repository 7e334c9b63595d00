"""A config file's name, checked against its content.

Config names follow the MLPerf submissions' convention `config_<SYSTEM>_<NODES>x<GPUS_PER_NODE>x
<MINIBS>x<LAYOUT>.toml`, LAYOUT being `tp<T>pp<P>cp<C>` (optionally `vp<V>`), e.g.
`config_GB200_1024x4x16xtp4pp8cp2.toml`. People read the name (and `sbatch -N` takes its NODES),
so a name that says one thing while the content asks for another is refused, naming each field
that differs with both numbers. Only a name that follows the convention is checked
(`tiny_cpu.toml` is not), each number as written.

The name is compared with a valid content only (load_config validates first): the nodes of an
invalid layout are no number to rename a file to, and a new name is proposed only for a config
that passes every rule.

`--set` overrides that make the content disagree with the name are the user's explicit choice:
they get a warning instead (load_config's `warn`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

NAME = re.compile(r"^config_(?P<system>[A-Za-z0-9\-]+)_(?P<nodes>\d+)x(?P<gpus>\d+)x"
                  r"(?P<minibs>\d+)x(?P<layout>(?:(?:tp|pp|vp|cp)\d+)+)$")
_LAYOUT = re.compile(r"(tp|pp|vp|cp)(\d+)")


@dataclass(frozen=True, slots=True)
class Mismatch:
    what: str
    """'nodes', 'GPUs per node', 'MiniBS', 'TP', ..."""
    in_name: int
    in_content: int
    keys: tuple[str, ...]
    """The config keys the content's number comes from."""
    derived: bool = False
    """The content's number is computed from `keys` (nodes, GPUs per node), not one of them."""

    def describe(self) -> str:
        """'nodes: name says 1024, config gives 1020 (from system.id, system.racks, ...)'."""
        keys = ", ".join(self.keys)
        return (f"{self.what}: name says {self.in_name}, config gives {self.in_content} "
                f"({'from ' if self.derived else ''}{keys})")


def parse_name(path: str | Path) -> dict[str, int] | None:
    """The numbers a conventional config name states; None for other names."""
    m = NAME.match(Path(path).stem)
    if not m:
        return None
    out = {"nodes": int(m["nodes"]), "gpus": int(m["gpus"]), "minibs": int(m["minibs"])}
    out.update({k: int(v) for k, v in _LAYOUT.findall(m["layout"])})
    return out


def mismatches(cfg, path: str | Path) -> list[Mismatch]:
    """What the name of `path` says that `cfg` contradicts ([] for other names)."""
    said = parse_name(path)
    if said is None:
        return []
    out = []

    def cmp(what: str, key: str, content, keys: tuple[str, ...], derived=False) -> None:
        if key in said and content is not None and said[key] != content:
            out.append(Mismatch(what, said[key], int(content), keys, derived))

    try:
        d = cfg.derived
        nodes, gpus = d.nodes, d.system.gpus_per_node
    except Exception:  # noqa: BLE001 - an invalid config: validation names the problem
        nodes = gpus = None
    system_keys = ("system.id", "system.racks", "system.gpus_per_rack")
    cmp("nodes", "nodes", nodes, system_keys, derived=True)
    cmp("GPUs per node", "gpus", gpus, ("system.id",), derived=True)
    cmp("MiniBS", "minibs", cfg.batch.minibs, ("batch.minibs",))
    for k in ("tp", "pp", "vp", "cp"):
        cmp(k.upper(), k, getattr(cfg.parallel, k), (f"parallel.{k}",))
    return out


def format_name(system: str, nodes: int, gpus: int, minibs: int,
                layout: list[tuple[str, int]]) -> str:
    """THE config file name: config_<SYSTEM>_<nodes>x<gpus>x<minibs>x<layout>.toml, where layout
    is e.g. [("tp", 4), ("pp", 8), ("cp", 2)] -> tp4pp8cp2 (planner.writer writes these names;
    check_name reads them back)."""
    return (f"config_{system}_{nodes}x{gpus}x{minibs}x"
            + "".join(f"{k}{v}" for k, v in layout) + ".toml")


def expected_name(cfg, path: str | Path) -> str | None:
    """The conventional name of `cfg`'s content, in the style of `path`'s name; None for other
    names and for an invalid config (whose derived numbers, nodes above all, mean nothing)."""
    from .validate import problems
    m = NAME.match(Path(path).stem)
    if not m:
        return None
    try:
        if problems(cfg):
            return None
        d = cfg.derived
        nodes, gpus = d.nodes, d.system.gpus_per_node
    except Exception:  # noqa: BLE001
        return None
    p = cfg.parallel
    layout = [(k, getattr(p, k)) for k, _ in _LAYOUT.findall(m["layout"])]
    return format_name(m["system"], nodes, gpus, cfg.batch.minibs, layout)


def check_name(cfg, path: str | Path, overridden: set[str] | frozenset = frozenset()):
    """(errors, warnings) about the name of `path` and `cfg`: the contradictions the file's content
    makes are one error (each field that differs, both numbers, and the name to rename the file
    to when the config is valid); those that only `overridden` keys (dotted, from --set) make are
    one warning."""
    errors: list[Mismatch] = []
    warnings: list[Mismatch] = []
    for m in mismatches(cfg, path):
        (warnings if overridden & set(m.keys) else errors).append(m)
    where = Path(path)
    err, warn = [], []
    if errors:
        fix = expected_name(cfg, path)
        todo = (f"fix the content, or rename the file to {fix}" if fix else
                "fix the content first (it breaks the config rules), then the name")
        err = [f"{where}: the file name does not say what the file runs:\n"
               + "".join(f"  - {m.describe()}\n" for m in errors)
               + f"the name must agree (logs, plans and `sbatch -N` read it): {todo}"]
    if warnings:
        warn = [f"{where}: with the --set overrides, the runs will not be what the file name says "
                "(logs, plans and `sbatch -N` read it): "
                + "; ".join(m.describe() for m in warnings)]
    return err, warn
