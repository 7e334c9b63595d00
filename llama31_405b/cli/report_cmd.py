"""`report LOG... [--out PNG] [--ruleset R]`: plots and a text summary of finished runs."""
from __future__ import annotations

import os

from ..failures import EXIT_INPUT, error
from ..outputs import OutputExists
from ..mlperf.checker import RULESET


def register(sub) -> None:
    p = sub.add_parser("report", help="PNG + text summary of finished runs")
    p.add_argument("logs", nargs="+", metavar="LOG")
    p.add_argument("--out", default=None, help="PNG path, a new file (default: report.png in "
                   "the working folder, or report-2.png, ... next to an earlier one; printed)")
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
    mixed = mixed_submitters(runs)
    if mixed:
        error(mixed)
        return EXIT_INPUT
    if args.out and os.path.lexists(args.out):     # refused before any work (and again,
        error(str(OutputExists(args.out, "give another --out")))   # atomically, at the write)
        return EXIT_INPUT
    try:
        summary = draw(runs, args.out or "report.png", ruleset=args.ruleset,
                       unique=args.out is None)
    except OutputExists as e:
        error(str(e))
        return EXIT_INPUT
    print(summary.text())
    print(f"report: {summary.png}")
    return 0


SUBMITTER_KEYS = ("submission_org", "submission_platform", "submission_division")


def mixed_submitters(runs) -> str | None:
    """Why the runs cannot be scored together (one olympic score and RCP normalisation are of
    one submitter's system in one division), or None: the first of SUBMITTER_KEYS that differs."""
    for key in SUBMITTER_KEYS:
        seen: dict[object, list[str]] = {}
        for r in runs:
            ev = r.first(key)
            seen.setdefault(None if ev is None else ev.value, []).append(str(r.path))
        if len(seen) > 1:
            return (f"the logs mix {key.removeprefix('submission_')}s: " + "; ".join(
                f"{v!r}: {', '.join(ps)}" for v, ps in seen.items())
                + "; report the logs of one organisation, platform and division together")
    return None


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
    summary = draw(runs, out_png, ruleset=ruleset, unique=True)   # the demo's default path
    print(summary.text())
    print(f"report: {summary.png}")
    return 1 if bad else 0
