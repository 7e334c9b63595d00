"""Loading configs from TOML: inheritance, strict keys, typed values.

A file may name a parent with a top-level `base = "other.toml"` (relative to the file); the child's
tables are merged over the parent's key by key. Every file is checked against the schema on its
own, so an unknown or misspelled key is reported with the file that holds it. Values are checked
against the field types (int, float, bool, str, Literal, optional, list, table).
"""
from __future__ import annotations

import dataclasses
import difflib
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .schema import Config
from .validate import validate as _validate

__all__ = ["ConfigError", "load_config"]


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _section_types(cls: type) -> dict[str, Any]:
    """The keys a file may set: init fields not marked internal (e.g. Config.source, which the
    loader sets)."""
    return {f.name: _hints(cls)[f.name] for f in dataclasses.fields(cls)
            if f.init and not f.metadata.get("internal")}


_DOCS: dict[type, dict[str, str]] = {}


def field_docs(cls: type) -> dict[str, str]:
    """The first sentence of the docstring under each field of a schema class (config.schema
    writes one under every field)."""
    if cls not in _DOCS:
        import ast
        import inspect
        import textwrap
        docs: dict[str, str] = {}
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
            body = tree.body if isinstance(tree, ast.ClassDef) else []
        except (OSError, TypeError, IndexError):
            body = []
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                text = " ".join(nxt.value.value.split())
                docs[node.target.id] = text.split(". ")[0].rstrip(".")
        _DOCS[cls] = docs
    return _DOCS[cls]


def _words(text: str) -> list[str]:
    import re
    return [w for w in re.split(r"[^a-z0-9]+", text.lower()) if w]


def _suggest(key: str, cls: type) -> str:
    """' (did you mean 'tp': Tensor-parallel size?)': the key whose name, or whose one-line
    description, the mistyped key resembles most ('' when none is close)."""
    docs = field_docs(cls)
    best, score, by_doc = None, 0.0, False
    tokens = _words(key)
    for name in _section_types(cls):
        s_name = difflib.SequenceMatcher(None, key.lower(), name.lower()).ratio()
        vocab = _words(name) + _words(docs.get(name, ""))
        s_doc = (sum(max((difflib.SequenceMatcher(None, t, w).ratio() for w in vocab),
                         default=0.0) for t in tokens) / len(tokens)) if tokens and vocab else 0.0
        s = max(s_name, s_doc)
        if s > score:
            best, score, by_doc = name, s, s_doc > s_name and s_name < 0.75
    if best is None or score < 0.75:
        return ""
    desc = docs.get(best, "")
    return (f" (did you mean {best!r}: {desc.rstrip('.')}?)" if by_doc and desc
            else f" (did you mean {best!r}?)")


def _check_keys(raw: dict, cls: type, path: Path, prefix: str) -> None:
    """Reject keys the schema does not have, naming file and dotted key."""
    types_ = _section_types(cls)
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in types_:
            raise ConfigError(f"{path}: unknown key {dotted!r}{_suggest(key, cls)}; "
                              f"valid keys here: {', '.join(types_)}")
        if dataclasses.is_dataclass(types_[key]):
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {dotted!r} must be a table [{dotted}]")
            _check_keys(value, types_[key], path, dotted + ".")


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict, dict[str, Path]]:
    """Raw merged dict and, for each dotted leaf key, the file that set it last."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: inheritance cycle via {' -> '.join(map(str, seen))}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    parent = raw.pop("base", None)
    _check_keys(raw, Config, path, "")
    origin = {k: path for k in _leaves(raw)}
    if parent is None:
        return raw, origin
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: 'base' must be a file name string")
    base_raw, base_origin = _read(path.parent / parent, seen + (path,))
    return _merge(base_raw, raw), {**base_origin, **origin}


def _leaves(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict) and k != "env":
            out += _leaves(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}")
    return out


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return {str(k): _coerce(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported type {tp}")


def _build(cls: type, raw: dict, origin: dict[str, Path], prefix: str) -> Any:
    kwargs = {}
    for name, tp in _section_types(cls).items():
        dotted = f"{prefix}{name}"
        if name not in raw:
            continue
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, raw[name], origin, dotted + ".")
        else:
            where = f"{origin.get(dotted, '?')}: {dotted}"
            kwargs[name] = _coerce(raw[name], tp, where)
    missing = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        files = sorted({str(p) for p in origin.values()}) or ["?"]
        raise ConfigError(f"{files[-1]}: missing required key(s) "
                          f"{', '.join(prefix + m for m in missing)}")
    return cls(**kwargs)


def _warn(message: str) -> None:
    import sys
    print(f"warning: {message}", file=sys.stderr, flush=True)


def load_config(path: str | Path, *, validate: bool = True, overrides: dict | None = None,
                warn=_warn) -> Config:
    """Load, merge, type-check and (by default) validate a config file.

    `overrides` is a nested dict merged last (e.g. {"run": {"seed_base": 7}}), checked like a file.
    Then, in this order: the content is validated (ConfigError listing every rule it breaks), and
    only a valid content is compared with a conventional file name
    (`config_<SYSTEM>_<nodes>x<gpus>x<minibs>x<layout>`, config.naming): ConfigError naming each
    field that differs, or `warn(message)` when only the overrides make them disagree. With
    `validate=False` an invalid content is returned as it is, its name unchecked.
    """
    from .naming import check_name
    from .validate import problems
    path = Path(path)
    raw, origin = _read(path)
    if overrides:
        _check_keys(overrides, Config, Path("<overrides>"), "")
        raw = _merge(raw, overrides)
        origin.update({k: Path("<overrides>") for k in _leaves(overrides)})
    cfg = _build(Config, raw, origin, "")
    cfg.source = str(path)
    cfg.record_origins({k: str(v) for k, v in origin.items()})
    if validate:
        _validate(cfg)
    elif problems(cfg):
        return cfg
    errors, warnings = check_name(cfg, path, set(_leaves(overrides or {})))
    if errors:
        raise ConfigError("\n".join(errors))
    for w in warnings:
        warn(w)
    return cfg
