"""`rehearse CONFIG [--ranks LIST] [--json] [--max-index-gb X]`: the launch, rank by rank, on
this machine (llama31_405b/rehearse, docs/rehearsal.md).

Exit status: 0 pass; 1 a rank, the dataset index, memory or the precheck failed; 2 bad config or
options; 3 the placement check failed (as `train` and run_and_time.sh's pre-flight)."""
from __future__ import annotations

import json
import os
import sys


def register(sub) -> None:
    from ..rehearse.run import DEFAULT_MAX_INDEX_GB
    from .options import add_set_option
    p = sub.add_parser("rehearse", help="rehearse the full-size launch rank by rank on this "
                                        "machine (fake process groups, meta-device model)")
    p.add_argument("config", metavar="CONFIG")
    p.add_argument("--ranks", metavar="LIST",
                   help="ranks to play, e.g. 0,4095,8188-8191 (default: one per pipeline stage, "
                        "each TP and CP position once, first and last DP replica)")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.add_argument("--max-index-gb", type=float, default=DEFAULT_MAX_INDEX_GB, metavar="X",
                   help=f"fail when the training index would exceed X GB (default "
                        f"{DEFAULT_MAX_INDEX_GB:g})")
    p.add_argument("--allocation", metavar="FILE",
                   help="the Slurm allocation: 'HOST RACK' per line in node order (default: the "
                        "config's nodes, whole racks in order)")
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), metavar="N",
                   help="rank processes at once (default: min(4, CPUs))")
    p.add_argument("--timeout", type=float, default=900.0, metavar="S",
                   help="seconds per rank process (default 900)")
    add_set_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..config import ConfigError
    from ..rehearse import report
    from ..rehearse.allocation import AllocationError
    from ..rehearse.run import Options, rehearse
    opts = Options(jobs=args.jobs, max_index_gb=args.max_index_gb, allocation=args.allocation,
                   sets=args.set, timeout_s=args.timeout)
    try:
        if args.ranks:
            from ..rehearse.ranks import parse_ranks
            from .options import load_with_sets
            world = load_with_sets(args.config, args.set).derived.world_size
            opts.ranks = parse_ranks(args.ranks, world)
        rep = rehearse(args.config, opts)
    except (ConfigError, AllocationError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return report.EXIT_CONFIG
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        print(report.format_text(rep))
    return rep["exit_code"]
