"""`demo`: what `make demo` runs. Until training lands it shows the resolved tiny and 128-rack
configs; it never prints a result it did not measure."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def register(sub) -> None:
    p = sub.add_parser("demo", help="the tiny default end to end (make demo)")
    p.set_defaults(func=run)


def run(args) -> int:
    from .config_cmd import show

    class _A:
        json = False
    for name in ("tiny_cpu.toml", "config_GB200_2048x4x8xtp4pp8cp2.toml"):
        _A.path = str(REPO / "configs" / name)
        if show(_A()):
            return 1
        print()
    return 0
