"""`demo` (what `make demo` runs): the tiny benchmark end to end on this machine.

1. tiny data (corpus -> tokenizer -> indexed datasets), if missing;
2. the tiny initial checkpoint (short pre-training on the separate shard), if missing;
3. one timed tiny run to the target, with progress lines, then its time-to-train;
4. the compliance verdict and the report plot (in-process: `mlperf.checker`, `submission.report`).
The initial checkpoint and the timed run are `python -m llama31_405b ...` commands, exactly as a
user or the launcher would run them.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = "configs/tiny_cpu.toml"


def register(sub) -> None:
    p = sub.add_parser("demo", help="the tiny benchmark end to end (make demo)")
    p.add_argument("--config", default=None, help=f"tiny config (default {CONFIG} of the "
                   "repository)")
    p.add_argument("--seed", type=int, default=None,
                   help="run seed (default: run.seed_base, else one from the system's entropy)")
    p.add_argument("--logdir", default=None, help="where result_0.txt goes (default: a new "
                   "<data_dir>/../logs/demo-<UTC time>, or demo-<UTC time>-2, ..., made at the "
                   "start; a folder already holding a result_0.txt "
                   "is refused: a result is never replaced)")
    p.set_defaults(func=run)


def _py(*args: str, quiet_stdout: bool = False) -> int:
    cmd = [sys.executable, "-m", "llama31_405b", *args]
    out = subprocess.DEVNULL if quiet_stdout else None
    return subprocess.run(cmd, cwd=REPO, stdout=out).returncode


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def run(args) -> int:
    from ..config import ConfigError, load_config
    # relative paths resolved once, against the working folder, before the move into the
    # repository (where the commands below run)
    args.config = str(Path(args.config).absolute()) if args.config else str(REPO / CONFIG)
    args.logdir = str(Path(args.logdir).absolute()) if args.logdir else None
    os.chdir(REPO)
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t_all = time.perf_counter()
    if args.logdir:
        logdir = Path(args.logdir)
    else:                # one folder per demo run, claimed now (mkdir(2): two demos started in
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())   # one second get -2, ...):
        from ..outputs import mkdir_exclusive      # nothing goes into another demo's folder
        logdir = mkdir_exclusive(Path(cfg.data.data_dir).parent / "logs" / f"demo-{stamp}",
                                 unique=True)
        _say(f"log folder {logdir} (new)")
    log = logdir / "result_0.txt"
    if log.exists():
        print(f"error: demo --logdir {logdir}: already holds result_0.txt (an earlier run's "
              f"result, kept: a result is never replaced); choose another --logdir, or leave it "
              f"unset for a new folder", file=sys.stderr)
        return 2
    from ..data.tiny import ensure_tiny_data
    _say(f"tiny data in {cfg.data.data_dir}")
    from ..data.layout import data_paths
    ensure_tiny_data(cfg.data.data_dir, manifest=data_paths(cfg).manifest)
    _say("initial checkpoint (pre-trained once on the separate shard, then reused)")
    if _py("train-init", "--config", args.config):
        _say("FAILED to make the initial checkpoint")
        return 1
    logdir.mkdir(parents=True, exist_ok=True)    # a named --logdir (the default one exists)
    from ..config.seeds import run_seeds
    seed = run_seeds(cfg.run.seed_base, 1)[0] if args.seed is None else args.seed
    _say(f"timed run: {args.config}, seed {seed}, MLPerf log {log}")
    rc = _py("train", "--config", args.config, "--seed", str(seed), "--log", str(log),
             quiet_stdout=True)
    from ..mlperf.log import load_run
    from .report_cmd import verdict_and_report
    run_log = load_run(log, strict=False) if log.exists() else None
    minutes = run_log.time_to_train_min if run_log is not None else None
    if run_log is None or minutes is None:
        _say(f"run failed before run_stop (exit {rc}); see {log}")
        return 1
    verdict = run_log.convergence()      # mlperf.verdict: the one owner of "converged"
    _say(f"time to train: {minutes:.2f} min (run_start -> run_stop), status {run_log.status}, "
         f"{verdict.describe()}")
    result = 0 if (rc == 0 and verdict.converged) else 1
    crc = verdict_and_report([str(log)], str(logdir / "report.png"))
    result = result or int(crc != 0)
    _say(f"demo finished in {(time.perf_counter() - t_all) / 60:.1f} min")
    return int(result)
