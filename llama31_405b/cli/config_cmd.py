"""`config check PATH...` and `config show PATH [--json]`.

Exit status (docs/cli.md): 0 every config is valid; 2 a config is missing, unreadable or
invalid (rules, file name, or predicted not to fit GPU memory), each named on its own `error:`
line."""
from __future__ import annotations

import dataclasses
import json
import sys


def register(sub) -> None:
    p = sub.add_parser("config", help="check or show configs")
    s = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    c = s.add_parser("check", help="validate config files (exit 0 when all are valid)")
    c.add_argument("paths", nargs="+", metavar="PATH")
    c.add_argument("--calibration", metavar="FILE", help="use a calibration's memory constants (plan --calibrate; docs/planner.md)")
    c.set_defaults(func=check)
    sh = s.add_parser("show", help="print the resolved config with every derived field")
    sh.add_argument("path", metavar="PATH")
    sh.add_argument("--json", action="store_true", help="machine-readable output")
    sh.set_defaults(func=show)


def check(args) -> int:
    from ..config import ConfigError, load_config
    from ..failures import EXIT_INPUT, error
    from ..planner.capacity import calibration_fit, memory_note, memory_problems
    bad = 0
    for path in args.paths:
        try:
            cfg = load_config(path)
        except ConfigError as e:
            bad += 1
            error(str(e))
            continue
        try:
            fit = calibration_fit(args.calibration, cfg) if args.calibration else None
        except ValueError as e:
            bad += 1
            error(f"{path}: --calibration: {e}")
            continue
        memory = memory_problems(cfg, fit)  # the planner's memory verdict (run.accept_memory_risk)
        if memory:
            bad += 1
            error(f"{path}: " + "; ".join(memory))
            continue
        if memory_note(cfg, fit):
            print(f"note {path}: {memory_note(cfg, fit)}")
        d = cfg.derived
        print(f"ok   {path}: {d.nodes} nodes, TP{cfg.parallel.tp}-PP{cfg.parallel.pp}-VP"
              f"{cfg.parallel.vp}-CP{cfg.parallel.cp} DP{d.dp}, GBS {d.gbs}, lr {d.lr!r}")
    return EXIT_INPUT if bad else 0


def resolved(cfg) -> dict:
    """The config as plain data plus every derived field."""
    d = cfg.derived
    derived = {f.name: getattr(d, f.name) for f in dataclasses.fields(d)
               if f.name not in ("system", "rules")}
    return {"config": dataclasses.asdict(cfg), "derived": derived,
            "system": dataclasses.asdict(d.system), "rules": dataclasses.asdict(d.rules)}


def show(args) -> int:
    from ..config import load_config
    cfg = load_config(args.path)  # a ConfigError ends the command: one error line, status 2
    data = resolved(cfg)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"# {args.path}")
    for section, values in data["config"].items():
        if isinstance(values, dict):
            print(f"[{section}]")
            for k, v in values.items():
                print(f"  {k} = {v!r}")
    print("[derived]")
    for k, v in data["derived"].items():
        print(f"  {k} = {v!r}")
    return 0
