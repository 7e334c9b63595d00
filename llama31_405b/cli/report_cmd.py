"""`report LOG... [--out PNG] [--ruleset R]`: plots and a text summary of finished runs."""
from __future__ import annotations

from ..failures import EXIT_INPUT, error
from ..mlperf.checker import RULESET


def register(sub) -> None:
    p = sub.add_parser("report", help="PNG + text summary of finished runs")
    p.add_argument("logs", nargs="+", metavar="LOG")
    p.add_argument("--out", default="report.png", help="PNG path (default: report.png)")
    p.add_argument("--ruleset", default=RULESET, help="ruleset of the RCP data")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..mlperf.log import LogError, load_run
    from ..submission.report import draw
    try:
        runs = [load_run(p) for p in args.logs]
    except LogError as e:
        error(str(e))
        return EXIT_INPUT
    if len({r.benchmark for r in runs}) != 1 or len({r.gbs for r in runs}) != 1:
        error("the logs mix benchmarks or batch sizes: " + ", ".join(
            f"{r.path} ({r.benchmark}, GBS {r.gbs})" for r in runs))
        return EXIT_INPUT
    summary = draw(runs, args.out, ruleset=args.ruleset)
    print(summary.text())
    print(f"report: {args.out}")
    return 0


def verdict_and_report(logs: list[str], out_png: str, ruleset: str = RULESET) -> int:
    """What `make demo` ends with: one compliance verdict line per log (tiny logs get the tiny
    rules), the report summary and the PNG path. Returns 0 only when every log passes."""
    from ..mlperf.checker import check_log
    from ..mlperf.log import LogError, load_run
    from ..mlperf.checker import judge
    from ..submission.report import draw
    bad = 0
    for path in logs:
        res = check_log(path, ruleset=ruleset)
        ok, line, _ = judge(res)
        print(f"compliance: {line}")
        if not ok:
            bad += 1
        if not res.ok:
            for line in res.summary()[1:]:
                print(f"  {line}")
    try:
        runs = [load_run(p) for p in logs]
    except LogError as e:
        error(str(e))
        return EXIT_INPUT
    summary = draw(runs, out_png, ruleset=ruleset)
    print(summary.text())
    print(f"report: {out_png}")
    return 1 if bad else 0
