"""`plan --explain`: racks -> MiniBS, GBS, step time, steps, time-to-train and scaling efficiency
vs 40 racks for the configs the writer produces, and a PNG of time-to-train and the step
breakdown vs racks."""
from __future__ import annotations

from pathlib import Path

from .writer import RACKS, SWITCH_MARGIN, ScalePlan, plans

REFERENCE_RACKS = 40
# The published scores (Azure's MLPerf Training v6.0 runs), drawn as reference points on the plot only.
PUBLISHED_MIN = {40: 18.79, 128: 7.07}

BREAKDOWN_KEYS = (("compute_total_s", "compute"), ("tp_s", "TP"), ("cp_s", "CP"), ("pp_s", "PP send/recv"),
                  ("bubble_s", "bubble"), ("dp_s", "DP exposed"), ("optimizer_s", "optimizer"))


def rows(sps: list[ScalePlan]) -> list[dict]:
    ref = next((s.chosen for s in sps if s.racks == REFERENCE_RACKS), None)
    out = []
    for s in sps:
        c = s.chosen
        eff = (ref.time_to_train_min * ref.racks / (c.time_to_train_min * c.racks)) if ref else None
        out.append(dict(racks=s.racks, nodes=c.nodes, minibs=c.minibs, gbs=c.gbs, step_time_s=c.step_time_s,
                        steps=c.steps, evaluations=c.evaluations, time_to_train_min=c.time_to_train_min,
                        mfu=c.mfu, scaling_efficiency_vs_40=eff, layout=c.layout, pinned=s.pinned,
                        switched=s.switched, planner_layout=s.best.layout, planner_minibs=s.best.minibs,
                        planner_time_to_train_min=s.best.time_to_train_min, breakdown=c.breakdown))
    return out


def table(data: list[dict]) -> str:
    head = (f"{'racks':>5} {'nodes':>5} {'layout':>16} {'MiniBS':>6} {'GBS':>5} {'step s':>7} {'steps':>5} "
            f"{'TTT min':>7} {'MFU':>6} {'eff@40':>6}  note")
    lines = [head, "-" * len(head)]
    for r in data:
        eff = f"{r['scaling_efficiency_vs_40']:.0%}" if r["scaling_efficiency_vs_40"] else "-"
        note = "published MiniBS" if r["pinned"] and not r["switched"] else ""
        if r["switched"]:
            note = f"planner's choice (> {SWITCH_MARGIN:.0%} faster than the published layout)"
        elif (r["planner_layout"], r["planner_minibs"]) != (r["layout"], r["minibs"]):
            note += (("; " if note else "") + f"planner: {r['planner_layout']} MiniBS "
                     f"{r['planner_minibs']} ({r['planner_time_to_train_min']:.2f} min)")
        lines.append(f"{r['racks']:>5} {r['nodes']:>5} {r['layout']:>16} {r['minibs']:>6} {r['gbs']:>5} "
                     f"{r['step_time_s']:>7.2f} {r['steps']:>5} {r['time_to_train_min']:>7.2f} "
                     f"{r['mfu']:>6.1%} {eff:>6}  {note}")
    return "\n".join(lines)


def plot(data: list[dict], path: Path, *, unique: bool = False) -> Path:
    """Two panels: time-to-train vs racks (with the published points), step breakdown vs racks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    racks = [r["racks"] for r in data]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    a.plot(racks, [r["time_to_train_min"] for r in data], "o-", label="planner (configs/)")
    a.plot(list(PUBLISHED_MIN), list(PUBLISHED_MIN.values()), "r*", ms=12, label="published (MLPerf v6.0)")
    for r in data:
        a.annotate(f"{r['minibs']}", (r["racks"], r["time_to_train_min"]), textcoords="offset points",
                   xytext=(4, 4), fontsize=7)
    a.set(xlabel="GB200 NVL72 racks", ylabel="time-to-train (min)", yscale="log",
          title="Llama 3.1 405B NVFP4: predicted time-to-train (labels: MiniBS)")
    a.grid(True, which="both", alpha=0.3)
    a.legend()
    bottom = [0.0] * len(data)
    x = range(len(data))
    for key, label in BREAKDOWN_KEYS:
        vals = [r["breakdown"][key] / r["step_time_s"] for r in data]
        b.bar(x, vals, bottom=bottom, label=label)
        bottom = [p + q for p, q in zip(bottom, vals)]
    b.set_xticks(list(x), [str(r) for r in racks])
    b.set(xlabel="racks", ylabel="share of the step", title="Step breakdown (slowest GPU)")
    b.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    from ..outputs import create_exclusive
    try:    # a new file: the default path, when taken, becomes planner_scaling-2.png, ...
        return create_exclusive(path, writer=lambda f: fig.savefig(f, format="png", dpi=110),
                                unique=unique, advice="give another --out")
    finally:
        plt.close(fig)


def explain(racks: tuple[int, ...] = RACKS, fit=None) -> list[dict]:
    """The GB200 configs' scaling (with the constants `fit`: a calibration's; default the
    published fit)."""
    return rows(plans(racks, fit=fit))
