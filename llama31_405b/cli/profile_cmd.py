"""`profile CONFIG`: a measured step breakdown of a config's run (not an MLPerf run).

    python -m llama31_405b profile CONFIG [--out DIR] [--skip 2] [--baseline 3] [--steps 3]
                                          [--ranks 0,1,...] [--seed N] [--set K=V ...]
    python -m llama31_405b profile --analyze DIR     # redo the analysis of a profile folder

Launched like `train` (one process per rank: torchrun, srun). Runs what train runs up to the end
of the warm-up, then the steps; every rank writes its files into DIR, rank 0 waits for them and
writes analysis.txt, analysis.json and breakdown.png (docs/profile.md). Exit status: 0 done,
1 the run or the analysis failed, 2 bad config or arguments.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from .options import add_set_option, load_or_report


def register(sub) -> None:
    p = sub.add_parser("profile", help="profile a few steady-state training steps (torch.profiler) "
                       "and break the step down, next to the planner's prediction (not an "
                       "MLPerf run)")
    p.add_argument("config_pos", nargs="?", metavar="CONFIG", help="config TOML")
    p.add_argument("--config", default=None, help="config TOML (instead of CONFIG)")
    p.add_argument("--out", default=None,
                   help="output folder, new or empty (default: a new out/profile/<config name>[-N], "
                        "printed; an earlier profile is never reused); marked as not an MLPerf run")
    p.add_argument("--skip", type=int, default=2, help="steps after the warm-up not recorded (default 2)")
    p.add_argument("--baseline", type=int, default=3,
                   help="steps timed without the profiler (the overhead ratio; 0: none; default 3)")
    p.add_argument("--steps", type=int, default=3, help="steps recorded (default 3)")
    p.add_argument("--ranks", default=None,
                   help="comma-separated global ranks to profile, or 'all' (default: every rank "
                        "of DP replica 0, plus the first rank of every other replica)")
    p.add_argument("--threshold", type=float, default=None,
                   help="straggler threshold, fraction of the step (default 0.10)")
    p.add_argument("--seed", type=int, default=None, help="run seed (as train)")
    p.add_argument("--init-checkpoint", default=None,
                   help="override checkpoint.ckpt_dir/checkpoint.init")
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="collective timeout, and how long rank 0 waits for the others' files")
    p.add_argument("--calibration", metavar="FILE", default=None,
                   help="the planner's constants for the predicted column: a calibration file "
                        "(plan --calibrate); default the published fit")
    p.add_argument("--analyze", metavar="DIR", default=None,
                   help="only analyse an existing profile folder (CONFIG optional: the "
                        "prediction)")
    add_set_option(p)
    p.set_defaults(func=run)


def _ranks(text: str | None, world: int) -> list[int] | None | str:
    if text is None:
        return None
    if text == "all":
        return list(range(world))
    try:
        ranks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        return f"--ranks {text!r}: give comma-separated integers or 'all'"
    bad = [r for r in ranks if not 0 <= r < world]
    if bad or not ranks:
        return f"--ranks {text!r}: ranks must lie in 0..{world - 1} (the config's world size)"
    return ranks


def run(args) -> int:
    from ..profile import straggler
    threshold = straggler.DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    path = args.config or args.config_pos
    if args.analyze:
        cfg = load_or_report(path, args.set) if path else None
        if path and cfg is None:
            return 2
        fit = _fit(args, cfg)
        if fit == 2:
            return 2
        return _analyze(Path(args.analyze), cfg, threshold, refused=2,  # a folder given: input
                        fit=fit, calibration=args.calibration)
    if not path:
        print("error: profile: give a config (CONFIG or --config), or --analyze DIR",
              file=sys.stderr)
        return 2
    if min(args.skip, args.baseline) < 0 or args.steps < 1:
        print("error: --skip and --baseline must be >= 0, --steps >= 1", file=sys.stderr)
        return 2
    from .train_cmd import _load, run_seed
    cfg = _load(argparse_ns(config=path, set=args.set))
    if cfg is None:
        return 2
    ranks = _ranks(args.ranks, cfg.derived.world_size)
    if isinstance(ranks, str):
        print(f"error: {ranks}", file=sys.stderr)
        return 2
    fit = _fit(args, cfg)  # before the run: a wrong calibration costs nothing
    if fit == 2:
        return 2
    seed = run_seed(cfg, args.seed)
    if seed is None:
        return 2
    from ..parallel.distributed import dist_env_from_environ
    from ..parallel.setup import teardown_parallel
    from ..profile.capture import Plan, run_profile
    de = dist_env_from_environ()
    out = _out_folder(args.out, Path(path).stem, de)
    if out is None:
        return 2
    from ..profile.marker import unusable
    # rank 0 alone judges the folder: it is the only writer, and another rank looking later
    # would find rank 0's own files there (a race that failed a 4-rank run in CI)
    why = unusable(out) if de.rank == 0 else None
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    plan = Plan(out=out, skip=args.skip, baseline=args.baseline, steps=args.steps, ranks=ranks)
    hook = run_profile(cfg, plan, seed=seed, dist_env=de, timeout_s=args.timeout_s,
                       init_checkpoint=args.init_checkpoint)
    try:
        teardown_parallel()
    except Exception:  # noqa: BLE001 - peers may be gone after a failure
        pass
    if not hook.done:
        print(f"error: rank {de.rank}: the run stopped before its profiled steps were written "
              f"({hook.stop_reason or 'no reason recorded'})", file=sys.stderr)
        return 1
    if de.rank != 0:
        return 0
    if not _wait_for_ranks(out, de.world_size, args.timeout_s):
        return 1
    return _analyze(out, cfg, threshold, fit=fit, calibration=args.calibration)


def _out_folder(given: str | None, stem: str, de) -> Path | None:
    """--out, else a new folder under out/profile (an earlier profile is never reused): one
    process takes the first free of out/profile/<stem>, <stem>-2, ... (printed); several ranks,
    which must agree on it before they can talk, take out/profile/<stem>-<job id> (Slurm's or
    torchrun's run id). None after printing why there is none."""
    if given:
        return Path(given)
    base = Path("out") / "profile" / stem
    if de.world_size == 1:
        from ..outputs import mkdir_exclusive
        out = mkdir_exclusive(base, unique=True)
        print(f"[profile] output folder: {out} (new; --out names another)", file=sys.stderr)
        return out
    import os
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID")
    if not job:
        print(f"error: profile: {de.world_size} ranks and no --out: give --out DIR (a new "
              "folder), the ranks cannot agree on a fresh default without a job id",
              file=sys.stderr)
        return None
    return base.with_name(f"{stem}-{job}")


def _fit(args, cfg):
    """The calibration's constants (None: the published fit), or 2 after printing why the file
    cannot be used for this config."""
    if not getattr(args, "calibration", None):
        return None
    from ..planner.calibrate import file as calibrated
    try:
        cal = calibrated.read(args.calibration)
    except ValueError as e:
        print(f"error: --calibration: {e}", file=sys.stderr)
        return 2
    bad = calibrated.mismatches(cal, cfg) if cfg is not None else []
    if bad:
        print("error: " + "\n  ".join(bad), file=sys.stderr)
        return 2
    return cal.fit


def argparse_ns(**kw):
    import argparse
    return argparse.Namespace(**kw)


def _wait_for_ranks(out: Path, world: int, timeout_s: float) -> bool:
    """Rank 0 waits until every rank wrote ranks/rank<R>.json (they finish together, but a
    shared file system may show the files late)."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r in range(world) if not (out / "ranks" / f"rank{r:05d}.json").is_file()]
        if not missing:
            return True
        if time.monotonic() > deadline:
            print(f"error: {out}/ranks: no file from rank(s) {missing[:16]} after {timeout_s:.0f} s "
                  "(did they fail? see their stderr)", file=sys.stderr)
            return False
        time.sleep(0.2)


def _analyze(out: Path, cfg, threshold: float, refused: int = 1, fit=None,
             calibration: str | None = None) -> int:
    """Analyse a profile folder; `refused`: the status when the folder cannot be analysed; the
    predicted column with `fit` (the constants of the file `calibration`)."""
    from ..profile.report import ProfileError, analyze_folder
    print(f"[profile] analysing {out} ...", file=sys.stderr, flush=True)
    try:
        res = analyze_folder(out, cfg=cfg, threshold=threshold, fit=fit,
                             calibration=calibration or "")
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return refused
    js, txt = res["files"][:2]
    print(Path(txt).read_text(), end="")
    print(f"analysis: {js}, {txt}; plot: {res.get('plot')} "
          f"(analysed in {res['analysis_s']:.1f} s)")
    return 0
