"""`launch env CONFIG`, `launch preflight --config CONFIG`, `launch check-log --config CONFIG LOG...`:
the pieces of run_and_time.sh that need the config; `launch hostnames NODELIST` and
`launch hostlist HOST...`: Slurm hostlist expressions expanded and made, where `scontrol` is
missing (a machine or container without Slurm's tools).

Exit codes (shared with `train`): 0 ok, 1 failure, 2 bad config or arguments, 3 placement check
failed (the layout of the job cannot work; retrying the same allocation is pointless); check-log
also 4: a log without run_stop (the run was killed before it could log one).
"""
from __future__ import annotations

import sys

from .options import add_set_option, load_or_report, load_with_sets, run_count

EXIT_OK, EXIT_FAIL, EXIT_CONFIG, EXIT_PLACEMENT = 0, 1, 2, 3


def register(sub) -> None:
    p = sub.add_parser("launch", help="launcher helpers: env for run_and_time.sh, pre-flight, "
                                      "result checks")
    s = p.add_subparsers(dest="launch_command", required=True, metavar="ACTION")

    e = s.add_parser("env", help="print the launch plan of a config as shell assignments")
    e.add_argument("config", metavar="CONFIG")
    e.add_argument("--runs", type=run_count, default=None, help="runs (default: run.num_runs)")
    e.add_argument("--seed-base", type=int, default=None,
                   help="run i uses seed SEED_BASE + i (default: run.seed_base; without one, "
                        "each run's seed is drawn from the system's entropy)")
    e.add_argument("--check-dirs", action="store_true",
                   help="check that the data folder, the tokenizer and the checkpoint folder are "
                        "readable here; the first problem goes into LAUNCH_DIRS_ERROR")
    add_set_option(e)
    e.set_defaults(func=env)

    f = s.add_parser("preflight", help="refuse a config predicted not to fit GPU memory (exit 2), "
                                       "gather every rank's placement at rank 0 (plain TCP, the "
                                       "launcher's MASTER_ADDR/port) and check it (exit 0 ok, "
                                       "3 misplaced, 1 a rank did not join in time)")
    f.add_argument("--config", required=True, metavar="CONFIG")
    f.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for all ranks to join (default 120)")
    f.add_argument("--calibration", metavar="FILE", help="use a calibration's memory constants (plan --calibrate; docs/planner.md)")
    add_set_option(f)
    f.set_defaults(func=preflight)

    h = s.add_parser("hostnames", help="one host per line of a Slurm hostlist expression "
                                       "(like `scontrol show hostnames`)")
    h.add_argument("nodelist", metavar="NODELIST", help='e.g. "gb-r[001-128]-n[01-16]"')
    h.set_defaults(func=hostnames)

    hl = s.add_parser("hostlist", help="a Slurm hostlist expression for hosts (like "
                                       "`scontrol show hostlist`)")
    hl.add_argument("hosts", nargs="+", metavar="HOST", help="hosts, or comma-separated lists")
    hl.set_defaults(func=hostlist)

    c = s.add_parser("check-log", help="compliance checker + run_stop status of result logs "
                                        "(exit 0 ok, 1 a log fails, 4 a log has no run_stop)")
    c.add_argument("--config", required=True, metavar="CONFIG",
                   help="the config the runs used (selects the benchmark's rules)")
    c.add_argument("--require-success", action="store_true",
                   help="fail a log whose run_stop status is not success")
    c.add_argument("--report-dir", default=None, metavar="DIR",
                   help="keep the checker's whole verdict here as <log stem>.compliance.log")
    c.add_argument("--launcher-log", default=None, metavar="FILE",
                   help="the run's console (the launcher's stderr): what torchrun or srun "
                        "reported about the run's processes is added to the line")
    c.add_argument("logs", nargs="+", metavar="LOG")
    add_set_option(c)
    c.set_defaults(func=check_log)


def env(args) -> int:
    from ..config import ConfigError
    from ..launch import launch_plan, shell_assignments
    try:
        plan = launch_plan(load_with_sets(args.config, args.set), runs=args.runs,
                           seed_base=args.seed_base, check_dirs=args.check_dirs)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    sys.stdout.write(shell_assignments(plan))
    return EXIT_OK


def hostnames(args) -> int:
    from ..parallel.distributed import expand_hostlist
    try:
        hosts = expand_hostlist(args.nodelist)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    sys.stdout.write("".join(h + "\n" for h in hosts))
    return EXIT_OK


def hostlist(args) -> int:
    from ..parallel.distributed import compress_hostlist
    hosts = [h for arg in args.hosts for h in arg.split(",") if h]
    print(compress_hostlist(hosts))
    return EXIT_OK


def preflight(args) -> int:
    from ..parallel.distributed import dist_env_from_environ
    from ..parallel.gather import GatherError, all_gather
    from ..parallel.placement import PlacementError, check_placement
    from ..planner.capacity import calibration_fit, memory_note, memory_problems
    cfg = load_or_report(args.config, args.set)
    if cfg is None:
        return EXIT_CONFIG
    de = dist_env_from_environ()
    try:
        fit = calibration_fit(args.calibration, cfg) if args.calibration else None
    except ValueError as e:
        print(f"error: --calibration: {e}", file=sys.stderr)
        return EXIT_CONFIG
    memory = memory_problems(cfg, fit)  # before any process group: every rank refuses alike
    if memory or memory_note(cfg, fit):
        if de.rank == 0:
            print("\n".join(f"error: {m}" for m in memory) or f"note: {memory_note(cfg, fit)}",
                  file=sys.stderr if memory else sys.stdout, flush=True)
        if memory:
            return EXIT_CONFIG
    # the ranks' placements meet at rank 0 over plain TCP (parallel/gather.py): no torch import,
    # no process group, on thousands of ranks
    def gather(mine):
        return all_gather(mine, rank=de.rank, world_size=de.world_size, addr=de.master_addr,
                          port=de.master_port, timeout_s=args.timeout)
    try:
        check_placement(cfg, de, gather=gather)
    except PlacementError as e:
        # every rank holds the same message: one copy (rank 0) is enough for thousands of ranks
        if de.rank == 0:
            print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_PLACEMENT
    except GatherError as e:
        if de.rank == 0 or not e.from_rank0:
            print(f"error: pre-flight: {e}", file=sys.stderr, flush=True)
        return EXIT_FAIL
    if de.rank == 0:
        print(f"preflight ok: {de.world_size} rank(s) via {de.launcher}, placement good",
              flush=True)
    return EXIT_OK


def check_log(args) -> int:
    """One line per log: PASS/FAIL, compliance, and how the run ended (success, aborted with the
    logged reason, or no run_stop). Exit 0 all good, 1 a log fails, 4 a log has no run_stop
    (the run was killed), 2 bad config."""
    from ..launch.launcher_report import read_launcher_report
    from ..launch.logcheck import check_log as check_one, exit_code
    from ..mlperf.log import LogError
    cfg = load_or_report(args.config, args.set)
    if cfg is None:
        return EXIT_CONFIG
    verdicts = []
    launcher = read_launcher_report(args.launcher_log)
    for log in args.logs:
        try:
            v = check_one(log, cfg.run.benchmark, args.report_dir, division=cfg.run.division)
        except LogError as e:          # e.g. the project's rules file for the benchmark missing
            print(f"error: {e}", file=sys.stderr)
            return EXIT_CONFIG
        except OSError as e:           # the verdict cannot be written (full disk, read-only)
            where = e.filename or args.report_dir or log
            print(f"error: launch check-log {log}: cannot write into {where}: "
                  f"{e.strerror or e}; free space there or pass another --report-dir",
                  file=sys.stderr)
            return EXIT_FAIL
        verdicts.append(v)
        # a rank that stopped answering (train.heartbeat): the launcher lists whichever task
        # ended first, and a stopped rank 0 leaves no run_stop to name it
        from ..train.heartbeat import stopped_first
        stopped = "" if v.success else stopped_first(log)
        print(v.line(args.require_success) + "".join(f"; {w}" for w in (stopped, launcher) if w),
              flush=True)
    return exit_code(verdicts, args.require_success)
