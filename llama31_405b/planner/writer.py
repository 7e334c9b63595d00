"""`plan --write-configs`: the per-scale configs in configs/, from the planner, for every system
the project ships configs for (`TARGETS`: GB200 NVL72 racks, DGX B200, HGX H200 and H100 nodes).

At each scale the planner's best fitting layout and MiniBS (`sweep`) is weighed against the
measured one: the layout of the published runs, TP4-PP8-VP8-CP2 (`MEASURED`: Azure's GB200 run
and the published DGX B200 configuration), with the published MiniBS where a published run gives
one (`Target.published_minibs`) and the planner's best MiniBS for that layout elsewhere. The
planner's choice wins when it is predicted faster by more than the model's own error
(`SWITCH_MARGIN`); a smaller predicted gain cannot be told from the model's error, and the
measured configuration stays. Where the measured layout does not fit the GPU's memory (H100), the
planner's best layout is written. On 8-GPU systems the planner's choice keeps the measured TP:
the in-NVLink communication constant was fitted at TP4 only, so the model cannot rank TP sizes
(docs/planner.md). Each file inherits its system's base, sets system.racks (on 8-GPU systems the
nodes) and batch.minibs (and [parallel] when the layout differs from the base's) and
run.max_steps, the cap of its GBS (`config.rcp.max_steps_for`: the largest multiple of 50 steps
within twice the RCP mean samples-to-converge), and its header says which rule chose it, what
the planner preferred and what it predicts. The files are created in a new folder, or in a
named one next to what it holds: a file of the same name there is refused (llama31_405b.outputs:
a result is never replaced) and nothing is deleted; the base path is written relative to that
folder (in configs/ itself: `base/...`), and every written file is loaded and validated.
"""
from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from ..config.naming import format_name
from ..config.rcp import MAX_STEPS_ROUNDING, RCP_MULTIPLE, max_steps_for, rcp_mean
from ..outputs import OutputExists, create_exclusive, mkdir_exclusive
from ..systems import load_system
from .calibrate.constants import Fitted
from .step import Prediction
from .sweep import Fixed, sweep

MEASURED = dict(tp=4, pp=8, vp=8, cp=2)
"""The published runs' layout (Azure's MLPerf Training v6.0 GB200 write-up; the published DGX B200
configuration of MLPerf Training v5.1), also every base config's."""
SWITCH_MARGIN = 0.06
"""Predicted time-to-train gain the planner's choice needs to replace the measured configuration:
the model's largest error on the published figures it predicts (bench/planner_vs_published.py:
time-to-train -5.7% at 128 racks; MFU at DP 8 -2.0%; time-to-train -2.3% at 40 racks; the DGX B200
step -5.6%)."""
BENCHMARK = "llama31_405b"
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
"""The repository's configs/, holding the base configs every written file inherits."""


@dataclass(frozen=True, slots=True)
class Target:
    """The configs of one system."""
    system: str
    prefix: str
    """config_<PREFIX>_<NODES>x<GPUS_PER_NODE>x<MINIBS>xtp<T>pp<P>cp<C>.toml"""
    base: str
    """The base config the per-scale files inherit (relative to configs/)."""
    scales: tuple[int, ...]
    """system.racks of each file: NVL72 racks, or nodes on 8-GPU systems."""
    published_minibs: tuple[tuple[int, int], ...] = ()
    """(scale, MiniBS) of the published runs on this system."""

    @property
    def spec(self):
        return load_system(self.system)

    @property
    def unit(self) -> str:
        return "nodes" if self.spec.node_nvlink_domain else "racks"

    def published(self, racks: int) -> int | None:
        return dict(self.published_minibs).get(racks)


GB200 = Target("gb200-nvl72", "GB200", "base/gb200_405b.toml", (8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128),
               ((8, 144), (40, 24), (112, 8), (128, 8)))
"""MiniBS of Azure's published runs at 8, 40, 112 and 128 racks (the same write-up)."""
DGXB200 = Target("dgx-b200", "DGXB200", "base/dgxb200_405b.toml", (32, 56, 128), ((32, 144),))
"""MiniBS 144 at 32 nodes: the University of Florida's published DGX B200 run (FP8, MLPerf
Training v5.1); the configs here are NVFP4, which the B200 runs natively."""
H200 = Target("h200-sxm", "H200", "base/h200_405b.toml", (64, 128))
H100 = Target("h100-sxm", "H100", "base/h100_405b.toml", (512, 1024))
TARGETS = (GB200, DGXB200, H200, H100)
SYSTEM, RACKS, BASE = GB200.system, GB200.scales, GB200.base
PUBLISHED_MINIBS = dict(GB200.published_minibs)


@dataclass(frozen=True, slots=True)
class ScalePlan:
    racks: int
    chosen: Prediction
    """What the config uses."""
    best: Prediction
    """The planner's best fitting layout and MiniBS at this scale (with the measured TP on
    8-GPU systems)."""
    measured: Prediction | None
    """The measured layout at the published MiniBS (or the planner's best MiniBS for it); None
    when it does not fit."""
    layout_best: Prediction | None
    """The planner's best MiniBS for the measured layout (None when it does not fit)."""
    target: Target = GB200
    misfit: str = ""
    """Why the measured layout does not fit (when `measured` is None)."""

    @property
    def pinned(self) -> bool:
        """The scale has a published MiniBS."""
        return self.target.published(self.racks) is not None and self.measured is not None

    @property
    def switched(self) -> bool:
        return self.chosen is self.best and (self.measured is None or not same(self.best, self.measured))

    @property
    def gain(self) -> float:
        """Predicted time-to-train saved by the planner's best over the measured configuration."""
        if self.measured is None:
            return 0.0
        return 1 - self.best.time_to_train_min / self.measured.time_to_train_min

    @property
    def filename(self) -> str:
        c, t = self.chosen, self.target
        return format_name(t.prefix, c.nodes, t.spec.gpus_per_node, c.minibs,
                           [("tp", c.tp), ("pp", c.pp), ("cp", c.cp)])


def same(a: Prediction, b: Prediction) -> bool:
    return (a.tp, a.pp, a.vp, a.cp, a.minibs) == (b.tp, b.pp, b.vp, b.cp, b.minibs)


@cache
def candidates(racks: int, system: str = SYSTEM,
               fit: Fitted | None = None) -> tuple[tuple[Prediction, ...], tuple[Prediction, ...]]:
    """(every fitting candidate, ranked, with the measured TP on 8-GPU systems; every valid
    batch size of the measured layout, ranked, fitting first), both from the schedule simulation
    (the measured layout is swept on its own so that all its batch sizes are simulated)."""
    node = load_system(system).node_nvlink_domain
    ranked = tuple(p for p in sweep(system, racks, Fixed(tp=MEASURED["tp"]) if node else Fixed(),
                                    fit=fit) if p.fits)
    layout = tuple(sweep(system, racks, Fixed(tp=MEASURED["tp"], pp=MEASURED["pp"], vp=MEASURED["vp"],
                                              cp=MEASURED["cp"]), fit=fit))
    return ranked, layout


def plan_scale(racks: int, target: Target = GB200, fit: Fitted | None = None) -> ScalePlan:
    ranked, everything = candidates(racks, target.system, fit)
    layout = [p for p in everything if p.fits]
    name = "TP{tp}-PP{pp}-VP{vp}-CP{cp}".format(**MEASURED)
    if not layout:
        if not ranked:
            raise ValueError(f"{racks} {target.unit} of {target.system}: no layout fits")
        why = everything[0].why_not if everything else "no valid batch size"
        return ScalePlan(racks=racks, chosen=ranked[0], best=ranked[0], measured=None,
                         layout_best=None, target=target, misfit=f"{name} {why}")
    measured = layout[0]
    pub = target.published(racks)
    if pub is not None:
        pinned = [p for p in layout if p.minibs == pub]
        if not pinned:
            raise ValueError(f"{racks} {target.unit}: the published MiniBS {pub} does not fit or "
                             f"is not valid with {name} on {target.system}")
        measured = pinned[0]
    best = min((ranked[0], layout[0]), key=lambda p: p.time_to_train_min) if ranked else layout[0]
    switch = best.time_to_train_min < measured.time_to_train_min * (1 - SWITCH_MARGIN)
    return ScalePlan(racks=racks, chosen=best if switch else measured, best=best, measured=measured,
                     layout_best=layout[0], target=target)


def origin(sp: ScalePlan) -> str:
    """The sentence saying which rule chose the config."""
    b, m = sp.best, sp.measured
    tp = " with the published TP (the model cannot rank TP sizes)" \
        if sp.target.spec.node_nvlink_domain else ""
    if m is None:
        return (f"The published layout does not fit ({sp.misfit}): the planner's best layout and "
                f"MiniBS{tp}.")
    what = "MiniBS of the published run" if sp.pinned else "the planner's best MiniBS for it"
    if sp.switched:
        return (f"The planner's best layout and MiniBS{tp}: predicted {sp.gain:.1%} faster than the "
                f"published layout TP{m.tp}-PP{m.pp}-VP{m.vp}-CP{m.cp} at MiniBS {m.minibs}, more than "
                f"the model's {SWITCH_MARGIN:.0%} error.")
    if same(b, m):
        return f"Layout of the published run, {what}: also the planner's best{tp}."
    return (f"Layout of the published run, {what}. The planner's best{tp}, {b.layout} at MiniBS "
            f"{b.minibs}, is predicted {sp.gain:.1%} faster: inside the model's {SWITCH_MARGIN:.0%} "
            f"error, so the measured configuration stays.")


def _title(sp: ScalePlan) -> str:
    c, t = sp.chosen, sp.target
    spec = t.spec
    prec = c.precision.upper()
    lay = f"TP{c.tp}-PP{c.pp}-VP{c.vp}-CP{c.cp}"
    if spec.node_nvlink_domain:
        per = c.tp * c.pp * c.cp // spec.gpus_per_node
        return (f"# Llama 3.1 405B {prec} on {sp.racks} {spec.name} nodes ({spec.gpus_per_node} GPUs "
                f"each): {lay}, one model replica\n# per {per} node(s) (TP inside a node, PP across "
                f"nodes), DP = {c.dp}, MiniBS {c.minibs}, GBS {c.gbs}. Written by\n"
                f"# `python -m llama31_405b plan --write-configs`.\n")
    return (f"# Llama 3.1 405B {prec} on {sp.racks} {spec.name} racks ({c.nodes} nodes x "
            f"{spec.gpus_per_node} GPUs): {lay} per rack,\n"
            f"# DP = {c.dp}, MiniBS {c.minibs}, GBS {c.gbs}. Written by `python -m llama31_405b plan "
            f"--write-configs`.\n")


def render(sp: ScalePlan, base: str | None = None) -> str:
    """The config file's text; `base`: the base config's path relative to the file's folder
    (default the target's, relative to configs/)."""
    c, t = sp.chosen, sp.target
    parallel = ""
    if (c.tp, c.pp, c.vp, c.cp) != tuple(MEASURED.values()):
        parallel = f"\n[parallel]\ntp = {c.tp}\npp = {c.pp}\nvp = {c.vp}\ncp = {c.cp}\n"
    racks = f"racks = {sp.racks}"
    if t.spec.node_nvlink_domain:
        racks += f"  # nodes: on {t.spec.name} a rack (NVLink domain) is one node"
    return (
        _title(sp)
        + f"{textwrap.fill(origin(sp), 98, initial_indent='# ', subsequent_indent='# ')}\n"
        f"# Predicted: step {c.step_time_s:.2f} s, {c.steps} steps, {c.time_to_train_min:.1f} min "
        f"({c.time_to_train_range_min[0]:.1f}-{c.time_to_train_range_min[1]:.1f} over the RCPs' "
        f"spread), {c.memory_per_gpu_gb:.0f} of {c.memory['capacity_gb']:.0f} GB per GPU.\n"
        f'base = "{base or t.base}"\n\n[system]\n{racks}\n\n[batch]\nminibs = {c.minibs}\n{parallel}'
        f"\n[run]\nmax_steps = {max_steps_for(BENCHMARK, c.gbs)}  # {RCP_MULTIPLE} x RCP mean "
        f"{rcp_mean(BENCHMARK, c.gbs).mean:,.0f} samples / GBS {c.gbs}, down to "
        f"{MAX_STEPS_ROUNDING} steps\n")


def plans(racks: tuple[int, ...] | None = None, target: Target = GB200,
          fit: Fitted | None = None) -> list[ScalePlan]:
    """The ScalePlans of one target (default: the GB200 configs) at its scales or `racks`."""
    return [plan_scale(r, target, fit) for r in (racks or target.scales)]


def all_plans(targets: tuple[Target, ...] = TARGETS, fit: Fitted | None = None) -> list[ScalePlan]:
    return [sp for t in targets for sp in plans(target=t, fit=fit)]


def write_configs(configs_dir: Path, targets: tuple[Target, ...] = TARGETS, fit: Fitted | None = None,
                  note: str = "", new: bool = False) -> tuple[Path, list[Path]]:
    """Create the per-scale configs of `targets` (with the constants `fit`, default the published
    fit; `note` names a calibration in each file's first line) in `configs_dir`: with `new`, a new
    folder (`configs_dir`, else `<configs_dir>-2`, ...); otherwise next to the folder's files, an
    existing file of a written name refused (OutputExists) before any is written; nothing is
    deleted. Each file inherits the repository's base config by a path relative to the folder.
    Returns (the folder, the files written)."""
    from ..config.load import load_config
    plans_ = all_plans(targets, fit)
    configs_dir = Path(configs_dir)
    taken = [configs_dir / sp.filename for sp in plans_ if os.path.lexists(configs_dir / sp.filename)]
    if taken and not new:
        raise OutputExists(taken[0], "move the earlier configs away, or leave --configs-dir "
                           "unset for a new folder", what=f"{len(taken)} config(s) to write:")
    if new:
        configs_dir = mkdir_exclusive(configs_dir, unique=True)
    written = []
    for sp in plans_:
        base = os.path.relpath(CONFIGS / sp.target.base, configs_dir.resolve())
        text = render(sp, base)
        if note:
            text = f"# Predictions with the constants of {note}.\n{text}"
        path = create_exclusive(configs_dir / sp.filename, text,
                                advice="move the earlier configs away, or leave --configs-dir "
                                       "unset for a new folder")
        load_config(path)  # raises ConfigError naming the file if the validator rejects it
        written.append(path)
    return configs_dir, written


def expected_files(targets: tuple[Target, ...] = TARGETS, fit: Fitted | None = None) -> dict[str, str]:
    """File name -> content the writer produces (the config consistency test compares)."""
    return {sp.filename: render(sp) for sp in all_plans(targets, fit)}


def with_scales(target: Target, scales: tuple[int, ...]) -> Target:
    return replace(target, scales=scales)
