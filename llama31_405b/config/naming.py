"""A config file's name, checked against its content.

Config names follow the MLPerf submissions' convention `config_<SYSTEM>_<NODES>x<GPUS_PER_NODE>x
<MINIBS>x<LAYOUT>.toml`, LAYOUT being `tp<T>pp<P>cp<C>` (optionally `vp<V>`), e.g.
`config_GB200_1024x4x16xtp4pp8cp2.toml`. People read the name (and `sbatch -N` takes its NODES),
so a name that says one thing while the content asks for another is refused, naming both. Only a
name that follows the convention is checked (`tiny_cpu.toml` is not), each number as written.

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

    def describe(self) -> str:
        return (f"the name says {self.what} {self.in_name}, the content {self.in_content} "
                f"({', '.join(self.keys)})")


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

    def cmp(what: str, key: str, content, keys: tuple[str, ...]) -> None:
        if key in said and content is not None and said[key] != content:
            out.append(Mismatch(what, said[key], int(content), keys))

    try:
        d = cfg.derived
        nodes, gpus = d.nodes, d.system.gpus_per_node
    except Exception:  # noqa: BLE001 - an invalid config: validation names the problem
        nodes = gpus = None
    system_keys = ("system.id", "system.racks", "system.gpus_per_rack")
    cmp("nodes", "nodes", nodes, system_keys)
    cmp("GPUs per node", "gpus", gpus, ("system.id",))
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
    """The conventional name of `cfg`'s content, in the style of `path`'s name."""
    m = NAME.match(Path(path).stem)
    if not m:
        return None
    try:
        d = cfg.derived
        nodes, gpus = d.nodes, d.system.gpus_per_node
    except Exception:  # noqa: BLE001
        return None
    p = cfg.parallel
    layout = [(k, getattr(p, k)) for k, _ in _LAYOUT.findall(m["layout"])]
    return format_name(m["system"], nodes, gpus, cfg.batch.minibs, layout)


def check_name(cfg, path: str | Path, overridden: set[str] | frozenset = frozenset()):
    """(errors, warnings) about the name of `path` and `cfg`: a contradiction the file's content
    makes is an error; one that only `overridden` keys (dotted, from --set) make is a warning."""
    errors, warnings = [], []
    for m in mismatches(cfg, path):
        (warnings if overridden & set(m.keys) else errors).append(m)
    if not errors and not warnings:
        return [], []
    fix = expected_name(cfg, path)
    where = Path(path)
    err = [f"{where}: {m.describe()}; the name must say what the file runs: fix the content, or "
           f"rename the file to {fix}" for m in errors]
    warn = [f"{where}: with the --set overrides, {m.describe()}: the runs will not be what the "
            "file name says (logs, plans and `sbatch -N` read it)" for m in warnings]
    return err, warn
