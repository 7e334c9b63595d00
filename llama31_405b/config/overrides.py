"""`--set section.key=value` command-line overrides, parsed into the nested dict that
`load_config(path, overrides=...)` merges last and checks like a file.

Values are TOML values (`--set run.seed_base=7`, `--set system.rack_of_host={n1="r0"}`); a value
that is not valid TOML is taken as a string (`--set data.data_dir=/data`).
"""
from __future__ import annotations

import tomllib

from .errors import ConfigError
from .load import load_config


def parse_sets(items: list[str] | None) -> dict:
    out: dict = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise ConfigError(f"--set {item!r}: expected section.key=value (e.g. run.seed_base=7)")
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {p!r} was set to a value, not a table")
        node[parts[-1]] = value
    return out


def load_with_sets(path: str, sets: list[str] | None):
    """load_config(path) with the `--set SECTION.KEY=VALUE` overrides merged last; raises
    ConfigError."""
    return load_config(path, overrides=parse_sets(sets))
