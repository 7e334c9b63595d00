"""`plan --write-configs`: the per-scale GB200 configs in configs/, from the planner.

At each scale the planner's best fitting layout and MiniBS (`sweep`) is weighed against the
measured one: the published run's layout, TP4-PP8-VP8-CP2 (`MEASURED`), with the published
MiniBS where Azure's published runs give one (`PUBLISHED_MINIBS`) and the planner's best MiniBS for
that layout elsewhere. The planner's choice wins when it is predicted faster by more than the
model's own error (`SWITCH_MARGIN`); a smaller predicted gain cannot be told from the model's
error, and the measured configuration stays. Each file inherits the base, sets system.racks and
batch.minibs (and [parallel] when the layout differs from the base's) and run.max_steps, the
cap of its GBS (`config.rcp.max_steps_for`: the largest multiple of 50 steps within twice the RCP
mean samples-to-converge), and its header says which rule chose it, what the planner
preferred and what it predicts. Files matching
config_GB200_*.toml that the writer does not produce are deleted (they would be stale), and every
written file is loaded and validated.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..config.rcp import MAX_STEPS_ROUNDING, RCP_MULTIPLE, max_steps_for, rcp_mean
from .step import Prediction
from .sweep import Fixed, sweep

SYSTEM = "gb200-nvl72"
RACKS = (8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128)
MEASURED = dict(tp=4, pp=8, vp=8, cp=2)
"""The published run's layout (Azure's MLPerf Training v6.0 write-up), also
configs/base/gb200_405b.toml's."""
PUBLISHED_MINIBS = {8: 144, 40: 24, 112: 8, 128: 8}
"""MiniBS the published runs used at these scales (the same write-up)."""
SWITCH_MARGIN = 0.06
"""Predicted time-to-train gain the planner's choice needs to replace the measured configuration:
the model's largest error on the published figures it predicts (bench/planner_vs_published.py:
time-to-train -5.7% at 128 racks; MFU at DP 8 -2.0%; time-to-train -2.3% at 40 racks)."""
BASE = "base/gb200_405b.toml"
BENCHMARK = "llama31_405b"


@dataclass(frozen=True, slots=True)
class ScalePlan:
    racks: int
    chosen: Prediction
    """What the config uses."""
    best: Prediction
    """The planner's best fitting layout and MiniBS at this scale."""
    measured: Prediction
    """The measured layout at the published MiniBS (or the planner's best MiniBS for it)."""
    layout_best: Prediction
    """The planner's best MiniBS for the measured layout."""

    @property
    def pinned(self) -> bool:
        """The scale has a published MiniBS."""
        return self.racks in PUBLISHED_MINIBS

    @property
    def switched(self) -> bool:
        return self.chosen is self.best and not same(self.best, self.measured)

    @property
    def gain(self) -> float:
        """Predicted time-to-train saved by the planner's best over the measured configuration."""
        return 1 - self.best.time_to_train_min / self.measured.time_to_train_min

    @property
    def filename(self) -> str:
        c = self.chosen
        return f"config_GB200_{c.nodes}x4x{c.minibs}xtp{c.tp}pp{c.pp}cp{c.cp}.toml"


def same(a: Prediction, b: Prediction) -> bool:
    return (a.tp, a.pp, a.vp, a.cp, a.minibs) == (b.tp, b.pp, b.vp, b.cp, b.minibs)


@cache
def candidates(racks: int, system: str = SYSTEM) -> tuple[tuple[Prediction, ...], tuple[Prediction, ...]]:
    """(every fitting candidate, ranked; the measured layout's fitting batch sizes, ranked), both
    from the schedule simulation (the measured layout is swept on its own so that all its batch
    sizes are simulated)."""
    ranked = tuple(p for p in sweep(system, racks) if p.fits)
    layout = tuple(p for p in sweep(system, racks, Fixed(**MEASURED)) if p.fits)
    return ranked, layout


def plan_scale(racks: int, system: str = SYSTEM) -> ScalePlan:
    ranked, layout = candidates(racks, system)
    if not layout:
        raise ValueError(f"{racks} racks: no MiniBS fits with TP4-PP8-VP8-CP2 on {system}")
    measured = layout[0]
    if racks in PUBLISHED_MINIBS:
        pinned = [p for p in layout if p.minibs == PUBLISHED_MINIBS[racks]]
        if not pinned:
            raise ValueError(f"{racks} racks: the published MiniBS {PUBLISHED_MINIBS[racks]} does not "
                             f"fit or is not valid with TP4-PP8-VP8-CP2")
        measured = pinned[0]
    best = min((ranked[0], layout[0]), key=lambda p: p.time_to_train_min)
    switch = best.time_to_train_min < measured.time_to_train_min * (1 - SWITCH_MARGIN)
    return ScalePlan(racks=racks, chosen=best if switch else measured, best=best, measured=measured,
                     layout_best=layout[0])


def origin(sp: ScalePlan) -> str:
    """The sentence saying which rule chose the config."""
    b, m = sp.best, sp.measured
    what = "MiniBS of the published run" if sp.pinned else "the planner's best MiniBS for it"
    if sp.switched:
        return (f"The planner's best layout and MiniBS: predicted {sp.gain:.1%} faster than the "
                f"published layout TP{m.tp}-PP{m.pp}-VP{m.vp}-CP{m.cp} at MiniBS {m.minibs}, more than "
                f"the model's {SWITCH_MARGIN:.0%} error.")
    if same(b, m):
        return f"Layout of the published run, {what}: also the planner's best."
    return (f"Layout of the published run, {what}. The planner's best, {b.layout} at MiniBS "
            f"{b.minibs}, is predicted {sp.gain:.1%} faster: inside the model's {SWITCH_MARGIN:.0%} "
            f"error, so the measured configuration stays.")


def render(sp: ScalePlan) -> str:
    c = sp.chosen
    parallel = ""
    if (c.tp, c.pp, c.vp, c.cp) != tuple(MEASURED.values()):
        parallel = f"\n[parallel]\ntp = {c.tp}\npp = {c.pp}\nvp = {c.vp}\ncp = {c.cp}\n"
    return (
        f"# Llama 3.1 405B NVFP4 on {sp.racks} GB200 NVL72 racks ({c.nodes} nodes x 4 GPUs): "
        f"TP{c.tp}-PP{c.pp}-VP{c.vp}-CP{c.cp} per rack,\n"
        f"# DP = {c.dp}, MiniBS {c.minibs}, GBS {c.gbs}. Written by `python -m llama31_405b plan "
        f"--write-configs`.\n"
        f"{textwrap.fill(origin(sp), 98, initial_indent='# ', subsequent_indent='# ')}\n"
        f"# Predicted: step {c.step_time_s:.2f} s, {c.steps} steps, {c.time_to_train_min:.1f} min "
        f"({c.time_to_train_range_min[0]:.1f}-{c.time_to_train_range_min[1]:.1f} over the RCPs' "
        f"spread), {c.memory_per_gpu_gb:.0f} of {c.memory['capacity_gb']:.0f} GB per GPU.\n"
        f'base = "{BASE}"\n\n[system]\nracks = {sp.racks}\n\n[batch]\nminibs = {c.minibs}\n{parallel}'
        f"\n[run]\nmax_steps = {max_steps_for(BENCHMARK, c.gbs)}  # {RCP_MULTIPLE} x RCP mean "
        f"{rcp_mean(BENCHMARK, c.gbs).mean:,.0f} samples / GBS {c.gbs}, down to "
        f"{MAX_STEPS_ROUNDING} steps\n")


def plans(racks: tuple[int, ...] = RACKS) -> list[ScalePlan]:
    return [plan_scale(r) for r in racks]


def write_configs(configs_dir: Path, racks: tuple[int, ...] = RACKS) -> tuple[list[Path], list[Path]]:
    """Write the per-scale configs; delete stale config_GB200_*.toml. Returns (written, deleted)."""
    from ..config.load import load_config
    configs_dir = Path(configs_dir)
    if not (configs_dir / BASE).is_file():
        raise FileNotFoundError(f"{configs_dir / BASE}: the base config the per-scale files inherit "
                                "is missing; pass --configs-dir pointing at the repository's configs/")
    out = {sp.filename: render(sp) for sp in plans(racks)}
    written = []
    for name, text in out.items():
        path = configs_dir / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
        load_config(path)  # raises ConfigError naming the file if the validator rejects it
        written.append(path)
    deleted = [p for p in sorted(configs_dir.glob("config_GB200_*.toml")) if p.name not in out]
    for p in deleted:
        p.unlink()
    return written, deleted


def expected_files(racks: tuple[int, ...] = RACKS) -> dict[str, str]:
    """File name -> content the writer produces (the config consistency test compares)."""
    return {sp.filename: render(sp) for sp in plans(racks)}
