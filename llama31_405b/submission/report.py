"""The report of a set of runs: one PNG and a short text summary.

Panels: eval log perplexity vs samples for every run with the target line and the reference
convergence band (RCP mean +- one standard deviation at the runs' GBS, from mlperf-logging's RCP
data for the benchmark and ruleset, the project's file for tiny), step time over the run (per-step
`tracked_stats` when logged, else block wall time / steps), and a table of time to train per run
with the olympic score.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config.rules import BENCHMARKS
from ..mlperf.checker import RULESET
from ..mlperf.log import RunLog
from .rcp import RcpRef, olympic_score, reference


@dataclass(slots=True)
class Summary:
    benchmark: str | None
    gbs: int | None
    target: float | None
    ref: RcpRef | None
    rows: list[tuple[str, object, str, float | None, float | None]]
    """(run name, seed, status, minutes, samples to converge)."""
    score: float | None
    norm_factor: float = 1.0
    """The RCP checker's normalisation for runs faster than the RCP mean (1.0 otherwise)."""
    rcp_message: str = ""
    png: str = ""
    """The PNG drawn (draw: the path taken)."""

    @property
    def scored(self) -> float | None:
        return None if self.score is None else self.score * self.norm_factor

    def text(self) -> str:
        lines = [f"{len(self.rows)} run(s) of {self.benchmark} at GBS {self.gbs}, target "
                 f"{self.target}"]
        if self.ref is not None:
            lines.append(f"reference: {self.ref.describe()}")
        for name, seed, status, minutes, samples in self.rows:
            t = f"{minutes:9.3f} min" if minutes is not None else "      n/a    "
            s = f"{samples:,.0f} samples" if samples is not None else "did not converge"
            lines.append(f"  {name:<24} seed {seed!s:>8}  {status:<8} {t}  {s}" if status ==
                         "success" else f"  {name:<24} seed {seed!s:>8}  {status}")
        if self.rcp_message:
            lines.append(f"RCP check: {self.rcp_message}; normalisation factor {self.norm_factor:.4f}")
        lines.append("olympic score: " + (f"{self.score:.3f} min raw, {self.scored:.3f} min "
                                          "RCP-normalised" if self.score is not None else
                                          "n/a (too few converged runs)"))
        return "\n".join(lines)


def summarize(runs: list[RunLog], ruleset: str = RULESET) -> Summary:
    bench = runs[0].benchmark if runs else None
    gbs = runs[0].gbs if runs else None
    target = BENCHMARKS[bench].target if bench in BENCHMARKS else runs[0].value("target_accuracy")
    ref = None
    if bench and gbs:
        try:
            ref = reference(bench, gbs, ruleset)
        except (FileNotFoundError, KeyError, ValueError):
            ref = None
    # one verdict per run (mlperf.verdict): a run the checkers would not count is marked and
    # left out of the score, whatever its run_stop says
    verdicts = [r.convergence() for r in runs]
    rows = [(Path(r.path).name, r.seed, "success" if v.converged else v.words, v.minutes,
             v.samples) for r, v in zip(runs, verdicts)]
    score = olympic_score([v.minutes for v in verdicts]) if len(runs) >= 3 else None
    norm, msg = 1.0, ""
    if ref is not None and len(runs) >= 3:
        from .rcp import check_runs
        res = check_runs(runs, ruleset=ruleset)
        norm, msg = res.norm_factor, f"{'pass' if res.ok else 'FAIL'} ({res.message})"
    return Summary(bench, gbs, target, ref, rows, score, norm, msg)


def draw(runs: list[RunLog], out_png: str | Path, ruleset: str = RULESET, *,
         unique: bool = False) -> Summary:
    """The summary, and its plot created as `out_png` (never over an existing file: OutputExists;
    with `unique`, a default path, the next free report-N.png; the path taken in .png)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summarize(runs, ruleset)
    fig = plt.figure(figsize=(13, 9))
    gs = fig.add_gridspec(2, 2, height_ratios=[3, 2])
    ax_eval = fig.add_subplot(gs[0, 0])
    ax_step = fig.add_subplot(gs[0, 1])
    ax_tab = fig.add_subplot(gs[1, :])

    for r in runs:
        ev = r.evals
        if ev:
            ax_eval.plot([x for x, _ in ev], [y for _, y in ev], marker="o", ms=3,
                         label=f"{Path(r.path).name} (seed {r.seed})")
    if s.target is not None:
        ax_eval.axhline(s.target, color="k", ls="--", lw=1, label=f"target {s.target}")
    if s.ref is not None and s.ref.mean is not None:
        lo, hi = s.ref.mean - (s.ref.stdev or 0), s.ref.mean + (s.ref.stdev or 0)
        ax_eval.axvspan(lo, hi, color="tab:green", alpha=0.15, label="RCP mean ± std")
        ax_eval.axvline(s.ref.mean, color="tab:green", lw=1)
        if s.ref.min_samples:
            ax_eval.axvline(s.ref.min_samples, color="tab:red", lw=1, ls=":",
                            label="fastest accepted mean")
    ax_eval.set_xlabel("samples")
    ax_eval.set_ylabel("eval log perplexity")
    ax_eval.set_title(f"{s.benchmark}, GBS {s.gbs}: evaluation")
    ax_eval.legend(fontsize=7)
    ax_eval.grid(alpha=0.3)

    src = "none"
    for r in runs:
        src, pts = r.step_times()
        if pts:
            ax_step.plot([x for x, _ in pts], [y for _, y in pts], lw=1, label=Path(r.path).name)
    ax_step.set_xlabel("samples")
    ax_step.set_ylabel("seconds per step")
    ax_step.set_title(f"step time ({src})")
    ax_step.grid(alpha=0.3)
    if ax_step.lines:
        ax_step.legend(fontsize=7)

    ax_tab.axis("off")
    cells = [[n, str(seed), st, f"{m:.3f}" if m is not None else "n/a",
              f"{x:,.0f}" if x is not None else "n/a"] for n, seed, st, m, x in s.rows]
    cells.append(["olympic score", "", "", f"{s.score:.3f}" if s.score is not None else "n/a", ""])
    if s.norm_factor != 1.0 and s.scored is not None:
        cells.append([f"RCP-normalised (x{s.norm_factor:.4f})", "", "", f"{s.scored:.3f}", ""])
    tab = ax_tab.table(cellText=cells, colLabels=["run", "seed", "status", "time to train [min]",
                                                   "samples to converge"], loc="center")
    tab.auto_set_font_size(False)
    tab.set_fontsize(9)
    tab.scale(1, 1.4)
    fig.tight_layout()
    from ..outputs import create_exclusive
    try:
        s.png = str(create_exclusive(out_png, writer=lambda f: fig.savefig(f, format="png",
                                                                           dpi=110),
                                     unique=unique, advice="give another --out"))
    finally:
        plt.close(fig)
    return s
