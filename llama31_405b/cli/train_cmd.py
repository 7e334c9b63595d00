"""`train`: one MLPerf run of a config on this process's rank (torchrun, Slurm or single).

    python -m llama31_405b train --config PATH [--seed N] [--log FILE]

Rank 0 prints the MLPerf log on stdout and appends it to --log; progress lines go to stderr.
Exit status 0 only when the run reached the target (run_stop status success); otherwise the kind
of failure (llama31_405b.failures: 3 placement, 2 bad config/checkpoint/data/device, 1 the run
aborted or failed).
"""
from __future__ import annotations

import sys

from .options import add_set_option, load_or_report


def register(sub) -> None:
    p = sub.add_parser("train", help="train a config (one MLPerf run)")
    p.add_argument("--config", required=True, help="config TOML (configs/...)")
    p.add_argument("--seed", type=int, default=None,
                   help="run seed (default: the config's run.seed_base; without one, a seed "
                        "drawn from the system's entropy)")
    p.add_argument("--log", "--mlperf-log", dest="log", default=None,
                   help="append the MLPerf log to this file (rank 0). Under torchrun write "
                   "--mlperf-log: torchrun's own parser rejects --log as an ambiguous prefix")
    p.add_argument("--init-checkpoint", default=None,
                   help="override checkpoint.ckpt_dir/checkpoint.init")
    p.add_argument("--timeout-s", type=float, default=None,
                   help="collective timeout: a dead or stopped peer ends the run after this long "
                   "at most (default: run.collective_timeout_s, 600)")
    p.add_argument("--cache-cleared", action="store_true",
                   help="the launcher dropped the page cache before this run (logged as cache_clear)")
    add_set_option(p)
    p.set_defaults(func=run)

    q = sub.add_parser("train-init", help="make a tiny config's initial checkpoint (short "
                       "pre-training on data.pretrain_prefix, saved to checkpoint.ckpt_dir/init)")
    q.add_argument("--config", required=True, help="config TOML with data.pretrain_prefix")
    q.add_argument("--steps", type=int, default=None, help="pre-training steps")
    q.add_argument("--force", action="store_true", help="rebuild even if it exists")
    add_set_option(q)
    q.set_defaults(func=run_init)

    f = sub.add_parser("first-contact", help="on one GPU (two for the DP 2 phase): the smallest "
                       "slice of the real training path at 405B width (TE layers and recipe, or "
                       "Megatron's local layers in BF16 without TE; full-iteration graphs, "
                       "checkpoint, warm-up, replay vs eager, steps, evaluation) and one layer's "
                       "speed, each check passed / failed / not run")
    from ..first_contact import add_arguments
    add_arguments(f)
    f.set_defaults(func=run_first_contact)


def run_first_contact(args) -> int:
    from ..first_contact import run as first_contact
    return first_contact(args)


def _load(args):
    """The config, checked against this process's hardware (systems.device.decide) before
    anything expensive; None after printing the problem (exit code 2)."""
    cfg = load_or_report(args.config, args.set)
    if cfg is None:
        return None
    from ..systems.device import DeviceError, decide
    try:
        decide(cfg)
    except DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    return cfg


def run_init(args) -> int:
    from ..parallel.setup import teardown_parallel
    from ..checkpoint.format import is_complete
    from ..train.pretrain import PRETRAIN_STEPS, init_checkpoint_path, make_init_checkpoint
    cfg = _load(args)
    if cfg is None:
        return 2
    path = init_checkpoint_path(cfg)
    if is_complete(path) and not args.force:
        print(f"initial checkpoint exists: {path}", file=sys.stderr)
        return 0
    make_init_checkpoint(cfg, steps=args.steps or PRETRAIN_STEPS)
    teardown_parallel()
    print(f"initial checkpoint written: {path}", file=sys.stderr)
    return 0


def run(args) -> int:
    cfg = _load(args)
    if cfg is None:
        return 2
    seed = run_seed(cfg, args.seed)
    if seed is None:
        return 2
    if args.timeout_s is not None and not args.timeout_s > 0:
        print(f"error: --timeout-s {args.timeout_s:g}: must be > 0 (seconds a collective waits "
              "for its peers)", file=sys.stderr)
        return 2
    return train(cfg, seed=seed, log_file=args.log, init_checkpoint=args.init_checkpoint,
                 timeout_s=args.timeout_s, cache_cleared=args.cache_cleared, sets=args.set)


def run_seed(cfg, given: int | None, environ=None) -> int | None:
    """The seed of this run: --seed, else run.seed_base, else one drawn from the system's entropy.
    A drawn seed would differ on every rank, so several ranks need --seed (run_and_time.sh draws
    one per run and passes it); None after printing why."""
    from ..config.seeds import run_seeds
    from ..parallel.distributed import dist_env_from_environ
    if given is not None:
        return given
    if cfg.run.seed_base is None:
        de = dist_env_from_environ(environ)
        if de.world_size > 1:
            if de.rank == 0:
                print(f"error: {cfg.source}: run.seed_base is not set, so the seed is drawn from "
                      f"the system's entropy, which would differ on each of the {de.world_size} "
                      "ranks: pass --seed N (run_and_time.sh draws one per run)", file=sys.stderr)
            return None
    return run_seeds(cfg.run.seed_base, 1)[0]


def train(cfg, *, seed: int, log_file: str | None = None, init_checkpoint: str | None = None,
          timeout_s: float | None = None, cache_cleared: bool = False, extra_hooks=(),
          sets=()) -> int:
    """One run of cfg on this rank; `sets`: the --set overrides cfg was loaded with (carried into
    the commands that messages suggest, e.g. `data verify`); `timeout_s`: the collective timeout
    (default run.collective_timeout_s). With a log file, every rank keeps a heartbeat beside it
    (train.heartbeat: a rank that stops answering is named). Returns the exit status."""
    from ..parallel.distributed import dist_env_from_environ
    from ..parallel.setup import teardown_parallel
    from ..train.loop import Run
    from ..train.mllog import MLPerfLogHook
    from ..train.progress import ProgressHook
    de = dist_env_from_environ()
    hooks = [MLPerfLogHook(cfg, seed=seed, log_file=log_file, rank=de.rank,
                           cache_cleared=cache_cleared),
             ProgressHook(cfg, rank=de.rank), *extra_hooks]
    timeout_s = cfg.run.collective_timeout_s if timeout_s is None else timeout_s
    run = Run(cfg, seed=seed, hooks=hooks, dist_env=de, timeout_s=timeout_s,
              init_checkpoint=init_checkpoint, sets=sets)
    beat = None
    if log_file:
        from ..train.heartbeat import Heartbeat, heartbeat_dir, interval_for
        beat = Heartbeat(heartbeat_dir(log_file), de.rank, de.world_size,
                         interval_for(timeout_s)).start()
    try:
        status = run.execute()
    finally:
        if beat is not None:
            beat.stop()
    try:
        teardown_parallel()
    except Exception:  # noqa: BLE001 - peers may be gone after a failure
        pass
    return outcome(run, status, rank=de.rank)


def outcome(run, status: str, *, rank: int) -> int:
    """The exit status of a finished run (llama31_405b.failures): 0 success, else the kind of
    the failure that ended it (3 placement, 2 bad input: config, checkpoint, data, device; 1
    otherwise). A run that failed before run_start says so in one error line (the log's run_stop
    carries the same reason); after run_start the progress line of run_stop is the summary."""
    from ..failures import EXIT_FAILED, debug_enabled, error, exit_code
    if status == "success":
        return 0
    exc = run.failure
    if not run.state.run_started:
        error(f"stopped before run_start: {run.state.reason or 'no reason recorded'}", rank=rank,
              exc=exc)
    elif exc is not None and debug_enabled():
        import traceback
        traceback.print_exception(exc, file=sys.stderr)
    return exit_code(exc) if exc is not None else EXIT_FAILED
