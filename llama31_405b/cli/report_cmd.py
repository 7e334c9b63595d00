"""`report LOG... [--out PNG] [--ruleset R]`: plots and a text summary of finished runs."""
from __future__ import annotations

import sys


def register(sub) -> None:
    p = sub.add_parser("report", help="PNG + text summary of finished runs")
    p.add_argument("logs", nargs="+", metavar="LOG")
    p.add_argument("--out", default="report.png", help="PNG path (default: report.png)")
    p.add_argument("--ruleset", default="6.0.0", help="ruleset of the RCP data")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..submission.mllog import LogError, load_run
    from ..submission.report import draw
    try:
        runs = [load_run(p) for p in args.logs]
    except LogError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if len({r.benchmark for r in runs}) != 1 or len({r.gbs for r in runs}) != 1:
        print("error: the logs mix benchmarks or batch sizes: " + ", ".join(
            f"{r.path} ({r.benchmark}, GBS {r.gbs})" for r in runs), file=sys.stderr)
        return 1
    summary = draw(runs, args.out, ruleset=args.ruleset)
    print(summary.text())
    print(f"report: {args.out}")
    return 0
