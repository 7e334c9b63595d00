"""`plan --write-configs`: the per-scale GB200 configs in configs/, from the planner.

Layout: TP4-PP8-VP8-CP2 (configs/base/gb200_405b.toml), the foundation's fixed choice for GB200.
MiniBS: the published runs' values where FACTS.md section 1 gives them (`PUBLISHED_MINIBS`), the
planner's best time-to-train for that layout elsewhere. Each file inherits the base and sets only
system.racks and batch.minibs; its header says where the MiniBS came from and what the planner
predicts. Files matching config_GB200_*.toml that the writer does not produce are deleted (they
would be stale), and every written file is loaded and validated.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .step import Prediction
from .sweep import Fixed, sweep

SYSTEM = "gb200-nvl72"
RACKS = (8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128)
LAYOUT = dict(tp=4, pp=8, vp=8, cp=2)
"""The GB200 layout of configs/base/gb200_405b.toml (the published run's)."""
PUBLISHED_MINIBS = {8: 144, 40: 24, 112: 8, 128: 8}
"""MiniBS the published runs used at these scales (FACTS.md section 1); kept over the model."""
BASE = "base/gb200_405b.toml"


@dataclass(frozen=True, slots=True)
class ScalePlan:
    racks: int
    chosen: Prediction
    """The prediction for the MiniBS the config uses."""
    model_best: Prediction
    """The planner's own best MiniBS for the layout (differs from `chosen` only where pinned)."""
    pinned: bool

    @property
    def filename(self) -> str:
        c = self.chosen
        return f"config_GB200_{c.nodes}x4x{c.minibs}xtp{c.tp}pp{c.pp}cp{c.cp}.toml"


def plan_scale(racks: int, system: str = SYSTEM) -> ScalePlan:
    ranked = [p for p in sweep(system, racks, Fixed(**LAYOUT)) if p.fits]
    if not ranked:
        raise ValueError(f"{racks} racks: no MiniBS fits with TP4-PP8-VP8-CP2 on {system}")
    best = ranked[0]
    if racks in PUBLISHED_MINIBS:
        pinned = [p for p in ranked if p.minibs == PUBLISHED_MINIBS[racks]]
        if not pinned:
            raise ValueError(f"{racks} racks: the published MiniBS {PUBLISHED_MINIBS[racks]} is not valid")
        return ScalePlan(racks=racks, chosen=pinned[0], model_best=best, pinned=True)
    return ScalePlan(racks=racks, chosen=best, model_best=best, pinned=False)


def render(sp: ScalePlan) -> str:
    c, b = sp.chosen, sp.model_best
    if sp.pinned and b.minibs != c.minibs:
        origin = (f"MiniBS of the published run; the planner prefers {b.minibs} "
                  f"({b.time_to_train_min:.1f} vs {c.time_to_train_min:.1f} min)")
    elif sp.pinned:
        origin = "MiniBS of the published run and the planner's choice"
    else:
        origin = "MiniBS: the planner's choice"
    return (
        f"# Llama 3.1 405B NVFP4 on {sp.racks} GB200 NVL72 racks ({c.nodes} nodes x 4 GPUs): "
        f"TP{c.tp}-PP{c.pp}-VP{c.vp}-CP{c.cp} per rack,\n"
        f"# DP = {c.dp}, MiniBS {c.minibs}, GBS {c.gbs}. Written by `python -m llama31_405b plan "
        f"--write-configs`.\n"
        f"# {origin}.\n"
        f"# Predicted: step {c.step_time_s:.2f} s, {c.steps} steps, {c.time_to_train_min:.1f} min.\n"
        f'base = "{BASE}"\n\n[system]\nracks = {sp.racks}\n\n[batch]\nminibs = {c.minibs}\n')


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
