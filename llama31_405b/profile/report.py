"""A profile folder -> analysis.json, analysis.txt and breakdown.png: every profiled rank's step
breakdown, the busiest rank next to the planner's prediction for the same config, communication
by process group, stragglers, the profiler's overhead and the trace sizes."""
from __future__ import annotations

import json
import time
from pathlib import Path
from statistics import median

from ..outputs import create_exclusive
from . import straggler, waits
from .analysis import RankAnalysis
from .marker import MANIFEST
from .trace import TraceError, load

ROWS = (
    # (label, measured component keys, planner breakdown keys)
    ("GEMM QKV", ("compute.gemm_qkv",), ("compute_qkv_s",)),
    ("attention core", ("compute.attention",), ("compute_attention_s",)),
    ("GEMM attention out proj", ("compute.gemm_proj",), ("compute_proj_s",)),
    ("GEMM FFN up/gate", ("compute.gemm_ffn_up",), ("compute_ffn_up_s",)),
    ("GEMM FFN down", ("compute.gemm_ffn_down",), ("compute_ffn_down_s",)),
    ("GEMM LM head", ("compute.gemm_lm_head",), ("compute_logits_s",)),
    ("other compute", ("compute.gemm_other", "compute.norm", "compute.activation",
                       "compute.attention_other", "compute.embedding", "compute.loss",
                       "compute.other"), ("compute_elementwise_s",)),
    ("optimizer", ("compute.optimizer",), ("optimizer_s",)),
    ("TP exposed", ("exposed.TP",), ("tp_s",)),
    ("CP exposed", ("exposed.CP",), ("cp_s",)),
    ("PP exposed (incl. bubble)", ("exposed.PP",), ("pp_s", "bubble_s")),
    ("DP exposed", ("exposed.DP",), ("dp_s",)),
    ("other comm exposed", ("exposed.other",), ()),
    ("host gaps", ("host_gap",), ("host_s",)),
)
CPU_NOTE = ("on CPU the planner's peaks are nominal (systems/cpu.toml), so this comparison checks "
            "the plumbing (every component measured and mapped), not the performance model; "
            "with --calibration (plan --calibrate) it checks the calibrated model")


class ProfileError(RuntimeError):
    pass


def _rows(components: dict, predicted: dict | None) -> list[dict]:
    out = []
    for label, mkeys, pkeys in ROWS:
        m = sum(components.get(k, 0.0) for k in mkeys)
        p = sum(predicted.get(k, 0.0) for k in pkeys) if predicted and pkeys else None
        out.append(dict(component=label, measured_s=m, predicted_s=p,
                        ratio=(m / p) if p else None))
    return out


def predicted_breakdown(cfg, fit=None) -> dict | None:
    """The planner's prediction for `cfg`, with the constants `fit` (a calibration's; default the
    published fit)."""
    try:
        from ..planner import predict
        p = predict(cfg, fit)
    except Exception as e:  # noqa: BLE001 - the measurement stands without a prediction
        return {"error": f"{type(e).__name__}: {e}"}
    return dict(step_time_s=p.step_time_s, **p.breakdown)


def _analyse_rank(meta_path: str) -> dict | str:
    """One rank's trace -> its mean breakdown and its steps (an error message on failure)."""
    mp = Path(meta_path)
    meta = json.loads(mp.read_text())
    r = meta["rank"]
    try:
        ra = RankAnalysis(load(mp.with_name(f"rank{r:05d}.trace.json.gz")), meta)
    except TraceError as e:
        return str(e)
    m = ra.mean()
    m.update(rank=r, steps_detail=[s.as_dict() for s in ra.steps], wait_inputs=ra.wait_inputs(),
             steps_busy=[(s.step_s, s.step_s - sum(s.exposed_by_role().values()))
                         for s in ra.steps])
    return m


def _map(fn, items: list, workers: int | None = None) -> list:
    """fn over items, in worker processes when there are several (the traces are independent;
    the CPU count bounds the workers; spawned: the caller may hold threads, e.g. torch's)."""
    import os
    workers = min(len(items), workers or os.cpu_count() or 1, 8)
    if workers < 2:
        return [fn(x) for x in items]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        return list(pool.map(fn, items))


def analyze_folder(out: str | Path, *, cfg=None, threshold: float = straggler.DEFAULT_THRESHOLD,
                   workers: int | None = None, fit=None, calibration: str = "") -> dict:
    """Analyse every trace of a profile folder (`workers` processes, default: the CPUs) and
    write analysis.json, analysis.txt and breakdown.png (or, next to an earlier analysis, kept,
    analysis-N.json, ...: result["files"]); the predicted column with the constants
    `fit` (the calibration file `calibration`; default the published fit)."""
    out = Path(out)
    t0 = time.perf_counter()
    manifest_path = out / MANIFEST
    if not manifest_path.is_file():
        raise ProfileError(f"{out}: no {MANIFEST}; not a folder written by `profile`")
    manifest = json.loads(manifest_path.read_text())
    records = {}
    for p in sorted((out / "ranks").glob("rank*.json")):
        d = json.loads(p.read_text())
        records[d["rank"]] = d
    metas = sorted((out / "traces").glob("rank*.meta.json"))
    if not metas:
        raise ProfileError(f"{out}/traces: no traces (did the run reach its profiled steps?)")
    per_rank = {}
    for m in _map(_analyse_rank, [str(mp) for mp in metas], workers):
        if isinstance(m, str):
            raise ProfileError(m)
        rec = records.get(m["rank"], {})
        m.update(host=rec.get("host", "?"), device=rec.get("device", "?"),
                 pp_rank=rec.get("pp_rank", 0), dp_rank=rec.get("dp_rank", 0),
                 tp_rank=rec.get("tp_rank", 0), cp_rank=rec.get("cp_rank", 0))
        per_rank[m["rank"]] = m
    peer, not_split = waits.peer_waits({r: dict(m.pop("wait_inputs"), host=m["host"])
                                        for r, m in per_rank.items()})
    for r, m in per_rank.items():
        m["waiting_s"] = peer[r]
    busiest = max(per_rank, key=lambda r: (per_rank[r]["compute_s"], -r))
    predicted = predicted_breakdown(cfg, fit) if cfg is not None else None
    pred_ok = predicted if predicted and "error" not in predicted else None
    # like with like: the planner describes its busiest pipeline stage; the measured side is
    # the mean of the profiled ranks of that stage (else the rank with the most compute)
    stage = int(pred_ok.get("rank", -1)) if pred_ok else -1
    compared = sorted(r for r, m in per_rank.items() if m["pp_rank"] == stage) or [busiest]
    keys = {k for r in compared for k in per_rank[r]["components"]}
    mean_components = {k: sum(per_rank[r]["components"].get(k, 0.0) for r in compared)
                       / len(compared) for k in keys}
    rows = _rows(mean_components, pred_ok)
    ratios = [d["overhead_ratio"] for d in records.values() if d.get("overhead_ratio")]
    sizes = [d["trace_bytes"] / max(1, len(d["profiled_step_s"])) for d in records.values()
             if d.get("trace_bytes")]
    result = dict(
        kind=manifest.get("kind"), mlperf_run=False, config=manifest.get("config"),
        layout=manifest.get("layout"), world_size=manifest.get("world_size"),
        profiled_ranks=sorted(per_rank), busiest_rank=busiest, compared_ranks=compared,
        compared_stage=per_rank[compared[0]]["pp_rank"],
        measured_step_s=sum(per_rank[r]["step_s"] for r in compared) / len(compared),
        predicted_step_s=pred_ok["step_time_s"] if pred_ok else None,
        calibration=calibration or "published (planner/published_128racks.toml)",
        prediction_error=predicted.get("error") if predicted else None,
        comparison=rows,
        waiting_for_peers=_mean_waits(per_rank, compared),
        waits_not_split=not_split,
        note=CPU_NOTE if cfg is not None and not cfg.derived.system.is_gpu else "",
        ranks=per_rank,
        stragglers=straggler.find(per_rank, threshold=threshold),
        step_time_outliers=straggler.step_time_outliers(records, threshold=threshold),
        straggler_threshold=threshold,
        overhead_ratio=median(ratios) if ratios else None,
        overhead_ratio_range=(min(ratios), max(ratios)) if ratios else None,
        overhead_ratio_per_rank={r: d.get("overhead_ratio") for r, d in records.items()},
        graphs_speedup=max((d["graphs_speedup"] for d in records.values()
                            if d.get("graphs_speedup")), default=None),
        trace_bytes_per_rank_per_step=max(sizes) if sizes else None,
        unattributed={r: m["unattributed"] for r, m in per_rank.items() if m["unattributed"]},
    )
    result["analysis_s"] = time.perf_counter() - t0
    paths = _claim_outputs(out, json.dumps(result, indent=1, default=str))
    result["files"] = [str(p) for p in paths]
    text = render(result)
    create_exclusive(paths[1], text + "\n", advice=ANALYSIS_ADVICE)
    try:
        result["plot"] = str(plot(result, paths[2]))
    except ImportError as e:   # matplotlib missing: the table and JSON still stand
        result["plot"] = f"not drawn ({e})"
    return result


def _mean_waits(per_rank: dict, compared: list) -> dict:
    """The compared ranks' mean exposed time waiting for a slower peer, by dimension
    (profile/waits.py; a dimension no compared rank split is absent)."""
    roles = sorted({k for r in compared for k in per_rank[r]["waiting_s"]})
    return {k: sum(per_rank[r]["waiting_s"].get(k, 0.0) for r in compared) / len(compared)
            for k in roles}


ANALYSIS_ADVICE = "a stray analysis file; move it away and analyse again"


def _claim_outputs(out: Path, data: str) -> list[Path]:
    """analysis.json, analysis.txt, breakdown.png; once a folder holds them (the analysis a
    calibration may name), analysis-2.json, ... : the first set none of whose files exists,
    claimed by creating its JSON exclusively (`data`). An earlier analysis is never replaced."""
    from ..outputs import candidates
    for n, base in enumerate(candidates(out / "analysis")):
        sfx = base.name[len("analysis"):]
        paths = [out / f"analysis{sfx}.json", out / f"analysis{sfx}.txt",
                 out / f"breakdown{sfx}.png"]
        if any(p.exists() for p in paths):
            continue
        try:
            create_exclusive(paths[0], data)
        except FileExistsError:
            continue
        return paths
    raise AssertionError("unreachable")


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:10.2f}"


def render(r: dict) -> str:
    lay = r.get("layout") or {}
    lines = [f"PROFILE (not an MLPerf run) of {r.get('config')}: TP{lay.get('tp')} PP{lay.get('pp')} "
             f"VP{lay.get('vp')} CP{lay.get('cp')} DP{lay.get('dp')}, {r.get('world_size')} ranks; "
             f"profiled ranks {r['profiled_ranks']}",
             "",
             f"Step breakdown of pipeline stage {r['compared_stage']} (mean of ranks "
             f"{r['compared_ranks']} over their profiled steps), next to the planner's prediction "
             f"for its busiest GPU (stage {r['compared_stage']}):",
             f"{'component':<28} {'measured ms':>11} {'predicted ms':>12} {'ratio':>7}"]
    total_m = 0.0
    for row in r["comparison"]:
        total_m += row["measured_s"]
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:7.2f}"
        lines.append(f"{row['component']:<28} {_ms(row['measured_s']):>11} "
                     f"{_ms(row['predicted_s']):>12} {ratio:>7}")
    ps = r.get("predicted_step_s")
    lines.append(f"{'step (sum of the above)':<28} {_ms(total_m):>11} {_ms(ps):>12} "
                 f"{(total_m / ps if ps else 0):7.2f}")
    wait = {k: v for k, v in (r.get("waiting_for_peers") or {}).items() if v > 0}
    if wait:
        lines.append("  of the exposed communication, waiting for a slower peer (in a collective "
                     "before its last member called it; the rest is the transfer): "
                     + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in sorted(wait.items())))
    for key, why in sorted((r.get("waits_not_split") or {}).items()):
        lines.append(f"  {key}: its waits not split from its transfers ({why})")
    if r.get("prediction_error"):
        lines.append(f"  no prediction: {r['prediction_error']}")
    if r.get("note"):
        lines.append(f"  note: {r['note']}")
    if r.get("predicted_step_s") is not None and r.get("calibration"):
        lines.append(f"  planner constants: {r['calibration']}")
    first = r["compared_ranks"][0]
    b = r["ranks"][first]
    lines += ["", f"Communication of rank {first} by process group (ms per step; every rank's "
                  "in analysis.json):",
              f"{'group':<40} {'dim':<5} {'ranks':<16} {'total':>9} {'overlap':>9} "
              f"{'exposed':>9}  ops"]
    for g in sorted(b["comm"].values(), key=lambda g: -g["total_s"]):
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(g["ops"].items()))
        lines.append(f"{g['desc'][:40]:<40} {g['role']:<5} {str(g['ranks'])[:16]:<16} "
                     f"{g['total_s'] * 1e3:9.2f} {g['overlapped_s'] * 1e3:9.2f} "
                     f"{g['exposed_s'] * 1e3:9.2f}  {ops}")
    lines += ["", "Per rank (ms per step): step = compute + exposed communication + host gaps",
              f"{'rank':>5} {'host':<12} {'device':<14} {'pp':>3} {'dp':>3} {'step':>9} "
              f"{'compute':>9} {'exposed':>9} {'host gap':>9} {'bubble':>9} {'peer wait':>9}"]
    for rank, m in sorted(r["ranks"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"{rank:>5} {str(m['host'])[:12]:<12} {str(m['device'])[:14]:<14} "
                     f"{m['pp_rank']:>3} {m['dp_rank']:>3} {m['step_s'] * 1e3:9.2f} "
                     f"{m['compute_s'] * 1e3:9.2f} {m['exposed_s'] * 1e3:9.2f} "
                     f"{m['host_gap_s'] * 1e3:9.2f} {m['bubble_s'] * 1e3:9.2f} "
                     f"{sum((m.get('waiting_s') or {}).values()) * 1e3:9.2f}")
    lines.append("")
    if r["stragglers"]:
        for s in r["stragglers"]:
            lines.append(f"STRAGGLER rank {s['rank']} (host {s['host']}, device {s['device']}, "
                         f"pipeline stage {s['pp_rank']}): busy {s['busy_s'] * 1e3:.1f} ms vs its "
                         f"peers' median {s['peers_busy_median_s'] * 1e3:.1f} ms (+"
                         f"{s['excess_fraction']:.0%} of the step); slow in {s['slow_in']}; it "
                         f"waited {s['waiting_s'] * 1e3:.1f} ms, its peers "
                         f"{s['peers_waiting_median_s'] * 1e3:.1f} ms")
    else:
        lines.append(f"stragglers: none (no rank busier than its pipeline-stage peers by more "
                     f"than {r['straggler_threshold']:.0%} of the step)")
    for o in r.get("step_time_outliers", []):
        lines.append(f"step-time outlier: rank {o['rank']} ({o['host']}): {o['step_s'] * 1e3:.1f} "
                     f"ms vs median {o['median_s'] * 1e3:.1f} ms")
    if r.get("unattributed"):
        lines.append(f"unattributed communication events: {r['unattributed']}")
    ov = r.get("overhead_ratio")
    rng = r.get("overhead_ratio_range")
    lines.append("profiler overhead: step time with / without the profiler = "
                 + ("not measured (--baseline 0)" if not ov else
                    f"{ov:.2f} (median of the ranks; {rng[0]:.2f}-{rng[1]:.2f})" if rng else
                    f"{ov:.2f} (median of the ranks)"))
    gs = r.get("graphs_speedup")
    if gs:
        lines.append(f"full-iteration CUDA graphs: the eager step (profiled) takes {gs:.2f} x the "
                     "replayed step (worst rank); the breakdown above is of eager steps")
    sz = r.get("trace_bytes_per_rank_per_step")
    if sz:
        lines.append(f"trace size: {sz / 1e6:.2f} MB per rank per step (gzipped JSON)")
    return "\n".join(lines)


def plot(r: dict, path: Path) -> Path:
    """Left: measured vs predicted stacked bars; right: every profiled rank's step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5.5))
    cmap = plt.get_cmap("tab20")
    colors = [cmap(i) for i in range(cmap.N)]  # a ListedColormap: its N colours by index
    bottoms = [0.0, 0.0]
    for i, row in enumerate(r["comparison"]):
        vals = [row["measured_s"] * 1e3, (row["predicted_s"] or 0.0) * 1e3]
        a.bar([0, 1], vals, bottom=bottoms, color=colors[i % len(colors)], label=row["component"])
        bottoms = [x + y for x, y in zip(bottoms, vals)]
    a.set_xticks([0, 1], [f"measured\n(stage {r['compared_stage']}, ranks {r['compared_ranks']})",
                          "planner"])
    a.set(ylabel="ms per step", title="Step breakdown: measured vs predicted")
    a.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ranks = sorted(r["ranks"], key=int)
    parts = (("compute", "compute_s"), ("exposed comm", "exposed_s"), ("host gaps", "host_gap_s"))
    bot = [0.0] * len(ranks)
    for i, (label, key) in enumerate(parts):
        vals = [r["ranks"][k][key] * 1e3 for k in ranks]
        b.bar(range(len(ranks)), vals, bottom=bot, label=label, color=colors[2 * i])
        bot = [x + y for x, y in zip(bot, vals)]
    slow = {s["rank"] for s in r["stragglers"]}
    b.set_xticks(range(len(ranks)), [f"{k}{'*' if k in slow else ''}" for k in ranks])
    b.set(xlabel="rank (* straggler)", ylabel="ms per step", title="Per profiled rank")
    b.legend(fontsize=8)
    if r.get("note"):
        fig.text(0.01, 0.01, "note: " + r["note"], fontsize=7)
    fig.suptitle("llama31_405b profile (NOT an MLPerf run)")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    try:
        create_exclusive(path, writer=lambda f: fig.savefig(f, format="png", dpi=100),
                         advice=ANALYSIS_ADVICE)
    finally:
        plt.close(fig)
    return path
