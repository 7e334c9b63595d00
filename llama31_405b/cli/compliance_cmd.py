"""`compliance precheck CONFIG...`, `compliance check LOG... [--ruleset R]`,
`compliance tiny-rules [--write]`, `compliance tiny-rcp LOG... [--out FILE]`."""
from __future__ import annotations

import sys

from ..mlperf.checker import RULESET


def register(sub) -> None:
    p = sub.add_parser("compliance", help="MLPerf compliance: before launch and on finished logs")
    s = p.add_subparsers(dest="compliance_command", required=True, metavar="ACTION")
    pre = s.add_parser("precheck", help="run the real checker on the events a config will log")
    pre.add_argument("configs", nargs="+", metavar="CONFIG")
    pre.add_argument("--ruleset", default=RULESET)
    pre.add_argument("--calibration", metavar="FILE", help="use a calibration's memory constants (plan --calibrate; docs/planner.md)")
    pre.set_defaults(func=precheck)
    chk = s.add_parser("check", help="run the compliance checker on finished logs")
    chk.add_argument("logs", nargs="+", metavar="LOG")
    chk.add_argument("--ruleset", default=RULESET)
    chk.add_argument("--config", default=None,
                     help="rule file (default: by the log's submission_benchmark)")
    chk.add_argument("-v", "--verbose", action="store_true", help="the checker's full messages")
    chk.set_defaults(func=check)
    tr = s.add_parser("tiny-rules", help="print compliance/tiny_llama31.yaml (or the open "
                                         "division's), or --write both")
    tr.add_argument("--write", action="store_true", help="write tiny_llama31{,_open}.yaml")
    tr.add_argument("--division", choices=("closed", "open"), default="closed",
                    help="the division whose rules to print (default: closed)")
    tr.set_defaults(func=tiny_rules)
    rc = s.add_parser("tiny-rcp", help="tiny reference convergence points from converged runs")
    rc.add_argument("logs", nargs="+", metavar="LOG")
    rc.add_argument("--out", default=None, help="a new file (default: compliance/"
                    "tiny_llama31_rcps.json, or tiny_llama31_rcps-2.json, ... next to an earlier "
                    "one; printed); an existing --out is refused")
    rc.add_argument("--creator", default="llama31_405b project")
    rc.add_argument("--platform", default="cpu")
    rc.add_argument("--precision", default="FP32")
    rc.set_defaults(func=tiny_rcp)


def precheck(args) -> int:
    from ..config import ConfigError, load_config
    from ..planner.capacity import calibration_fit, memory_note, memory_problems
    from ..submission.precheck import cross_config_problems, precheck_config
    from ..failures import EXIT_INPUT, error
    bad = unreadable = 0
    done = []
    for path in args.configs:
        try:
            cfg = load_config(path, validate=False)
        except ConfigError as e:   # missing, not TOML, unknown key, wrong type, misnamed: status 2
            error(str(e))
            unreadable += 1
            continue
        try:
            fit = calibration_fit(args.calibration, cfg) if args.calibration else None
        except ValueError as e:
            error(f"{path}: --calibration: {e}")
            unreadable += 1
            continue
        res = precheck_config(cfg, ruleset=args.ruleset)
        res.errors += [f"memory: {p}" for p in memory_problems(cfg, fit)]
        res.notes += [n for n in (memory_note(cfg, fit),) if n]
        done.append((cfg, res))
        rules = ", ".join(res.check.rule_files) if res.check else "not run"
        if res.ok:
            print(f"PASS {path}: GBS {cfg.derived.gbs}, seeds {res.seeds} (ruleset {args.ruleset}: "
                  f"{rules})")
        else:
            bad += 1
            print(f"FAIL {path}:", file=sys.stderr)
            for err in res.errors:
                print(f"  - {err}", file=sys.stderr)
        for n in res.notes:
            print(f"     {n}")
    for problem in cross_config_problems(done):
        # alternatives for one system are fine; submitting both for the same system is not
        print(f"warning: {problem}: do not submit both for the same system")
    return EXIT_INPUT if unreadable else 1 if bad else 0


def check(args) -> int:
    """The checker's verdict and the run's convergence (mlperf.verdict) per log: PASS only when
    the rules pass AND the run converged (an aborted run_stop passes the checker's rules)."""
    from ..mlperf.checker import check_log
    from ..mlperf.checker import judge
    from ..failures import EXIT_INPUT, error
    from ..mlperf.log import LogError, load_run
    from ..profile.marker import refusal
    bad = refused = 0
    for path in args.logs:
        why = refusal(path)
        try:
            if not why:
                load_run(path)   # the one reader: unreadable, damaged, or not an MLPerf log
        except LogError as e:
            why = str(e)
        if why:
            error(f"refused: {why}")
            refused += 1
            continue
        res = check_log(path, ruleset=args.ruleset, config=args.config)
        ok, line, _ = judge(res)
        print(line, file=sys.stdout if ok else sys.stderr)
        if not ok:
            bad += 1
        if not res.ok:
            for line in (res.details().splitlines() if args.verbose else res.summary()[1:]):
                print(f"  {line}", file=sys.stderr)
    return EXIT_INPUT if refused else 1 if bad else 0


def tiny_rules(args) -> int:
    from ..submission.tiny_rules import render_tiny_rules, write_tiny_rules
    if args.write:
        for division in ("closed", "open"):
            print(f"wrote {write_tiny_rules(division)}")
    else:
        sys.stdout.write(render_tiny_rules(division=args.division))
    return 0


def tiny_rcp(args) -> int:
    import datetime
    import os

    from ..mlperf.log import LogError, load_run
    from ..outputs import OutputExists
    from ..submission.rcp import TINY_RCP_FILE, rcp_records, write_rcps
    from .report_cmd import mixed_submitters
    try:
        if args.out and os.path.lexists(args.out):     # refused before any work (and again,
            raise OutputExists(args.out, "give another --out, or move the earlier file away")
        runs = [load_run(p) for p in args.logs]      # atomically, at the write)
        bad = [r.path for r in runs if r.benchmark != "tiny_llama31"]
        if bad:
            raise ValueError(f"not tiny_llama31 logs: {', '.join(bad)}")
        mixed = mixed_submitters(runs)      # an RCP is of one platform (and one submitter)
        if mixed:
            raise ValueError(mixed.replace("; report the logs", "; build an RCP from the logs"))
        recs = rcp_records(runs, creator=args.creator, platform=args.platform,
                           precision=args.precision,
                           when=f"measured {datetime.date.today().isoformat()} from "
                                f"{len(runs)} runs: " + ", ".join(args.logs))
        path = write_rcps(recs, args.out or TINY_RCP_FILE, unique=args.out is None)
    except (LogError, ValueError, OutputExists) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, rec in recs.items():
        n = len(rec["Epochs to converge"])
        print(f"{name}: BS {rec['BS']}, samples to converge {rec['Epochs to converge']}")
        if n < 6:
            print(f"  note: {n} runs; MLPerf RCPs use 6 (twice the submission's runs). With "
                  f"{n} the checker's t-test has {max(n - 3, 0)} degree(s) of freedom"
                  + (", so no run may be faster than the RCP mean" if n <= 3 else ""))
    print(f"wrote {path}")
    return 0
