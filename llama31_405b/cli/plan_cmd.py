"""`plan`: predict step time, time-to-train, MFU and memory of a layout, sweep layouts, write the
per-scale GB200 configs, or explain the scaling (docs/planner.md)."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("plan", help="performance model: predict, sweep layouts, write configs/",
                       description="Without a full layout, sweep every feasible layout ranked by "
                                   "predicted time-to-train; with --tp --pp --vp --cp --minibs, "
                                   "predict that layout.")
    p.add_argument("--system", default=None,
                   help="system id (llama31_405b/systems/*.toml; default gb200-nvl72)")
    p.add_argument("--racks", type=int, help="NVLink domains (racks); nodes for 8-GPU systems")
    p.add_argument("--nodes", type=int,
                   help="nodes instead of racks (8-GPU systems: the same; GB200 NVL72: 16 per rack)")
    for name in ("tp", "pp", "vp", "cp", "minibs"):
        p.add_argument(f"--{name}", type=int, help=f"fix {name.upper()} (default: sweep it)")
    p.add_argument("--mbs", type=int, default=1, help="microbatch size (default 1)")
    p.add_argument("--precision", choices=("nvfp4", "fp8", "bf16"),
                   help="GEMM precision (default: NVFP4 where native, else FP8)")
    p.add_argument("--recompute", choices=("none", "full", "any"), default="none",
                   help="activation recomputation (any: sweep both)")
    p.add_argument("--config", metavar="PATH", action="append",
                   help="predict the run of an existing config file; with --calibrate, the "
                        "profiled config (one per layout when the folders are of several)")
    p.add_argument("--top", type=int, default=10, help="sweep rows to show (0: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--write-configs", action="store_true",
                   help="write the per-scale config_<SYSTEM>_*.toml (GB200 8..128 racks; DGX B200, "
                        "H200 and H100 at a few node counts) into a new folder (see --configs-dir)")
    p.add_argument("--configs-dir", default=None,
                   help="where --write-configs writes (default: a new out/configs, or "
                        "out/configs-2, ...; printed); in a named folder an existing file of a "
                        "written name is refused, and nothing is deleted")
    p.add_argument("--explain", action="store_true",
                   help="table of the per-scale configs' predictions and a PNG (see --out)")
    p.add_argument("--out", default="out/planner_scaling.png", help="PNG path for --explain")
    p.add_argument("--calibrate", metavar="PROFILE_DIR", nargs="+",
                   help="fit the model's constants to a `profile` folder (several of the same "
                        "run: to the median of each figure; of several layouts, one --config "
                        "each: one fit of them all; or first contact's JSON report: a "
                        "partial calibration) and write them to --calibration-out")
    p.add_argument("--calibration-out", metavar="FILE", help="the calibration file --calibrate "
                   "writes (TOML; never overwritten)")
    p.add_argument("--calibration", metavar="FILE",
                   help="use the constants of a calibration file instead of the published fit")
    p.set_defaults(func=run)


def _fmt_row(p) -> str:
    fit = "yes" if p.fits else "NO"
    return (f"{p.layout:<18} {p.dp:>4} {p.minibs:>6} {p.gbs:>5} {p.step_time_s:>8.3f} {p.steps:>5} "
            f"{p.time_to_train_min:>8.2f} {p.mfu:>6.1%} {p.memory_per_gpu_gb:>6.0f} {fit:>4} "
            f"{'sim' if p.simulated else 'est':>4}")


HEADER = (f"{'layout':<18} {'DP':>4} {'MiniBS':>6} {'GBS':>5} {'step s':>8} {'steps':>5} "
          f"{'TTT min':>8} {'MFU':>6} {'GB':>6} {'fits':>4} {'step':>4}")


def _scale(system: str, racks: int, nodes: int | None = None) -> str:
    """"128 racks (2048 nodes)", or "32 nodes" where a rack is a node (8-GPU systems)."""
    from ..systems import load_system
    if load_system(system).node_nvlink_domain:
        return f"{racks} nodes"
    return f"{racks} racks" + (f" ({nodes} nodes)" if nodes is not None else "")


TP_NOTE = ("note: on 8-GPU systems layouts with a TP other than 4 are extrapolations: the model's "
           "in-NVLink communication constant was fitted at TP4 (docs/planner.md)")


def racks_of(system: str, racks: int | None, nodes: int | None) -> tuple[int | None, str]:
    """(racks, error): --racks as given, or --nodes converted to NVLink domains."""
    from ..systems import load_system
    if nodes is None:
        return racks, ""
    if racks is not None:
        return None, "give --racks or --nodes, not both"
    spec = load_system(system)
    gpus = nodes * spec.gpus_per_node
    if nodes < 1 or gpus % spec.gpus_used_per_rack:
        return None, (f"--nodes {nodes}: {spec.name} uses {spec.gpus_used_per_rack // spec.gpus_per_node} "
                      f"node(s) per rack; give a multiple of it")
    return gpus // spec.gpus_used_per_rack, ""


def _print_prediction(p) -> None:
    print(f"{p.system}, {_scale(p.system, p.racks, p.nodes)}: {p.layout} DP{p.dp} MiniBS {p.minibs} "
          f"MBS {p.mbs} GBS {p.gbs}, {p.precision}, recompute {p.recompute}")
    lo, hi = p.time_to_train_range_min
    print(f"  step {p.step_time_s:.3f} s   MFU {p.mfu:.2%}   {p.steps} steps ({p.evaluations} evaluations of "
          f"{p.eval_time_s:.1f} s)   time-to-train {p.time_to_train_min:.2f} min "
          f"({lo:.2f}-{hi:.2f} over the RCPs' spread)   samples to converge {p.samples_to_converge:,.0f}")
    if p.score_scale > 1:
        print(f"  the RCP checker scales the score by {p.score_scale:.4f} (converges faster than the "
              "RCP mean it is compared with)")
    print(f"  memory {p.memory_per_gpu_gb:.1f} GB per GPU: " + ", ".join(
        f"{k[:-3]} {v:.1f}" for k, v in p.memory.items())
          + ("" if p.fits else f"  -> DOES NOT FIT ({p.why_not})"))
    b = p.breakdown
    print("  step breakdown (s): " + ", ".join(
        f"{k[:-2]} {v:.4f}" for k, v in b.items() if k.endswith("_s") and k != "dp_unoverlapped_s"))


def _calibration(args, cfg=None):
    """(Calibration or None, exit status or None): --calibration read and checked against `cfg`."""
    if not args.calibration:
        return None, None
    from ..planner import calibrate
    try:
        cal = calibrate.read(args.calibration)
    except ValueError as e:
        print(f"error: --calibration: {e}", file=sys.stderr)
        return None, 2
    if cfg is not None:
        bad = calibrate.mismatches(cal, cfg)
        if bad:
            print("error: " + "\n  ".join(bad), file=sys.stderr)
            return None, 2
    return cal, None


def run(args) -> int:
    from ..config.load import ConfigError
    from ..outputs import OutputExists
    from ..planner import explain as ex
    from ..planner import writer
    from ..planner.spec import layout_problems, make_config
    from ..planner import predict
    from ..planner.capacity import memory_note
    from ..planner.sweep import Fixed, sweep

    if args.calibrate:
        from .calibrate import calibrate
        return calibrate(args)
    cal, rc = _calibration(args)
    if rc is not None:
        return rc
    fit = cal.fit if cal else None
    if args.write_configs:
        targets: tuple[writer.Target, ...] = writer.TARGETS
        if cal is not None:
            targets = tuple(t for t in writer.TARGETS if t.system == cal.summary.system)
            if not targets or cal.summary.model != "llama3.1-405b":
                print(f"error: --calibration {cal.path}: calibrated for system "
                      f"{cal.summary.system!r}, model {cal.summary.model!r}; --write-configs writes "
                      f"llama3.1-405b configs of {', '.join(t.system for t in writer.TARGETS)}",
                      file=sys.stderr)
                return 2
        try:
            folder, written = writer.write_configs(Path(args.configs_dir or "out/configs"), targets,
                                                   fit=fit, new=args.configs_dir is None,
                                                   note=f"calibration {cal.path}" if cal else "")
        except OutputExists as e:
            print(f"error: --configs-dir: {e}", file=sys.stderr)
            return 2
        except (ConfigError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"configs folder: {folder}")
        for path in written:
            print(f"wrote   {path}")
        return 0
    if args.explain:
        if cal is not None and (cal.summary.system, cal.summary.model) != ("gb200-nvl72",
                                                                            "llama3.1-405b"):
            print(f"error: --calibration {cal.path}: calibrated for {cal.summary.system} / "
                  f"{cal.summary.model}; --explain tabulates the GB200 configs (gb200-nvl72 / "
                  "llama3.1-405b)", file=sys.stderr)
            return 2
        data = ex.explain(fit=fit)
        if args.json:
            print(json.dumps(data, indent=2))
        else:
            print(ex.table(data))
        png = ex.plot(data, Path(args.out))
        print(f"plot: {png}", file=sys.stderr if args.json else sys.stdout)
        return 0
    if args.config:
        from .options import load_or_report
        if len(args.config) > 1:
            print(f"error: --config given {len(args.config)} times: plan predicts one config "
                  "(several only with --calibrate, one per profiled layout)", file=sys.stderr)
            return 2
        cfg = load_or_report(args.config[0], None)
        if cfg is None:
            return 2
        cal, rc = _calibration(args, cfg)
        if rc is not None:
            return rc
        p = predict(cfg, fit)
        print(json.dumps(p.as_dict(), indent=2)) if args.json else _print_prediction(p)
        if memory_note(cfg, fit):
            print(f"note: {memory_note(cfg, fit)}", file=sys.stderr if args.json else sys.stdout)
        return 0
    from ..systems import load_system
    args.system = args.system or "gb200-nvl72"
    try:
        spec = load_system(args.system)
    except ValueError as e:
        print(f"error: --system: {e}", file=sys.stderr)
        return 2
    args.racks, err = racks_of(args.system, args.racks, args.nodes)
    if err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.racks is None or args.racks < 1:
        print("error: --racks N or --nodes N (N >= 1) is required (or --config, --write-configs, "
              "--explain)", file=sys.stderr)
        return 2
    full = all(getattr(args, k) is not None for k in ("tp", "pp", "vp", "cp", "minibs"))
    if full:
        rc = "none" if args.recompute == "any" else args.recompute
        cfg = make_config(args.system, args.racks, tp=args.tp, pp=args.pp, vp=args.vp, cp=args.cp,
                          minibs=args.minibs, mbs=args.mbs, precision=args.precision, recompute=rc)
        found = layout_problems(cfg)
        if found:
            print("error: the config validator rejects this layout:\n  - " + "\n  - ".join(found),
                  file=sys.stderr)
            return 2
        cal, rc = _calibration(args, cfg)
        if rc is not None:
            return rc
        p = predict(cfg, fit)
        print(json.dumps(p.as_dict(), indent=2)) if args.json else _print_prediction(p)
        return 0
    fixed = Fixed(tp=args.tp, pp=args.pp, vp=args.vp, cp=args.cp, minibs=args.minibs, mbs=args.mbs,
                  precision=args.precision,
                  recompute=("none", "full") if args.recompute == "any" else (args.recompute,))
    if cal is not None:
        probe = make_config(args.system, args.racks, tp=1, pp=1, vp=1, cp=1, minibs=1,
                            precision=args.precision)
        cal, rc = _calibration(args, probe)
        if rc is not None:
            return rc
    ranked = sweep(args.system, args.racks, fixed, fit=fit)
    if not ranked:
        probe = make_config(args.system, args.racks, tp=args.tp or 1, pp=args.pp or 1, vp=args.vp or 1,
                            cp=args.cp or 1, minibs=args.minibs or (args.pp or 1) * args.mbs,
                            mbs=args.mbs, precision=args.precision)
        why = "\n  - ".join(layout_problems(probe)) or "no batch size passes the LR rule"
        print(f"error: no layout of {args.system} at {_scale(args.system, args.racks)} passes the "
              f"config validator; "
              f"e.g. TP{probe.parallel.tp}-PP{probe.parallel.pp}-CP{probe.parallel.cp}:\n  - {why}",
              file=sys.stderr)
        return 1
    shown = ranked if args.top == 0 else ranked[:args.top]
    if args.json:
        print(json.dumps({"system": args.system, "racks": args.racks,
                          "nodes": args.racks * spec.gpus_used_per_rack // spec.gpus_per_node,
                          "candidates": len(ranked),
                          "fitting": sum(p.fits for p in ranked),
                          "results": [p.as_dict() for p in shown]}, indent=2))
        return 0 if ranked[0].fits else 1
    n_fit = sum(p.fits for p in ranked)
    print(f"{args.system}, {_scale(args.system, args.racks)}: {len(ranked)} candidates, {n_fit} fit "
          f"in memory; "
          f"ranked by predicted time-to-train (step: sim = simulated schedule, est = closed-form "
          f"estimate of the screen)")
    print(HEADER)
    for p in shown:
        print(_fmt_row(p))
    if spec.node_nvlink_domain:
        print(TP_NOTE)
    if not ranked[0].fits:
        print(f"nothing fits: best candidate {ranked[0].layout} {ranked[0].why_not}", file=sys.stderr)
        return 1
    return 0
