"""`submission package --logs DIR --config CONFIG --org ORG --out DIR [--ruleset R]`."""
from __future__ import annotations

import sys

from ..mlperf.checker import RULESET


def register(sub) -> None:
    p = sub.add_parser("submission", help="assemble and check an MLPerf submission package")
    s = p.add_subparsers(dest="submission_command", required=True, metavar="ACTION")
    k = s.add_parser("package", help="results + systems + code, then every MLPerf checker")
    k.add_argument("--logs", required=True, help="directory with the runs' MLPerf logs")
    k.add_argument("--config", default=None, help="the config the runs used (system data, checks)")
    k.add_argument("--org", required=True, help="submitting organisation (top directory)")
    k.add_argument("--out", required=True, help="output directory")
    k.add_argument("--ruleset", default=RULESET)
    k.add_argument("--system-desc", default=None,
                   help="use this systems/<system>.json instead of generating one")
    k.add_argument("--system", default=None, help="system directory name (default: derived)")
    k.add_argument("--impl", default="megatron-core", help="implementation directory name")
    k.set_defaults(func=package)


def package(args) -> int:
    from ..config import load_config
    from ..failures import EXIT_INPUT, error
    from ..profile.marker import refusal
    from ..submission.package import package as build
    for path in (args.logs, args.out):
        why = refusal(path)
        if why:
            error(f"refused: {why}")
            return EXIT_INPUT
    # a ConfigError or PackageError (input refused) ends the command: one error line, status 2
    cfg = load_config(args.config) if args.config else None
    res = build(args.logs, out=args.out, org=args.org, cfg=cfg, system_desc=args.system_desc,
                system=args.system, impl=args.impl, ruleset=args.ruleset)
    print(f"package {res.org_dir} ({res.benchmark} on {res.system}, ruleset {args.ruleset})")
    for n in res.notes:
        print(f"note: {n}")
    for w in res.warnings:
        print(f"warning: {w}")
    for step in res.steps:
        print(step.line(), file=sys.stdout if step.ok and not step.skipped else sys.stderr)
    if res.ok and res.score_min is not None:
        print(f"score: {res.score_min:.3f} minutes (olympic mean, RCP-normalised)")
    elif res.score_min is not None:    # a failing package has no score: none printed beside FAIL
        print("score: none (a step above failed)")
    print("verdict: " + ("PASS" if res.ok else "FAIL"))
    return 0 if res.ok else 1
