"""The proof file (bench/planner_proof.toml): layouts, the proof's sections (fit and unseen
layouts), rounds, steps and tolerances, read into `Proof`; and each layout's config, as profiled
(with the work folder's data and checkpoints) and as committed (inheriting the repository's
config by a relative path, what the prediction reads)."""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROOF = ROOT / "bench" / "planner_proof.toml"
BASES = {"tiny": "tiny_cpu.toml", "gb200": "tiny_cpu_gb200.toml"}
PARALLEL = ("tp", "pp", "vp")
BATCH = {"minibs": "minibs", "mbs": "micro_batch_size"}
PERFORMANCE = {"overlap": ("overlap_grad_reduce", "overlap_param_gather"),
               "bucket": ("ddp_bucket_size",)}
"""Layout keys over the base config's [performance]: `overlap` (true or false) sets both of
megatron-core's DP overlaps, `bucket` the DDP bucket size in elements (model revision 19's fit
layouts with overlapped small buckets: the GB200 settings' DP in the tiny FP32 model)."""


@dataclass(frozen=True)
class Layout:
    name: str
    label: str
    base: str
    ranks: int
    overrides: tuple[tuple[str, int], ...] = ()

    def block(self) -> str:
        """The config lines this layout sets over its base config."""
        o = dict(self.overrides)
        out = []
        par = [f"{k} = {o[k]}" for k in PARALLEL if k in o]
        if par:
            out += ["[parallel]", *par, ""]
        bat = [f"{v} = {o[k]}" for k, v in BATCH.items() if k in o]
        if bat:
            out += ["[batch]", *bat, ""]
        perf = [f"{v} = {str(bool(o[k])).lower() if k == 'overlap' else o[k]}"
                for k, vs in PERFORMANCE.items() if k in o for v in vs]
        if perf:
            out += ["[performance]", *perf, ""]
        return "\n".join(out + ["[system]", f"gpus_per_rack = {self.ranks}", ""])


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    fit: tuple[str, ...]
    unseen: tuple[str, ...]

    @property
    def layouts(self) -> tuple[str, ...]:
        return self.fit + self.unseen


@dataclass(frozen=True)
class Proof:
    text: str
    date: str
    steps: int
    rounds: int
    step_tol: float
    component_tol: float
    negligible: float
    components: tuple[str, ...]
    layouts: dict[str, Layout]
    sections: tuple[Section, ...]
    core_calibration: str = ""
    core_pairs: tuple[tuple[str, str], ...] = ()

    @property
    def profiled(self) -> list[str]:
        """Every layout a run profiles: the sections' and the core-share pairs', fits first."""
        names: list[str] = []
        for n in [x for s in self.sections for x in s.fit] + [
                x for s in self.sections for x in s.unseen] + [x for p in self.core_pairs for x in p]:
            if n not in names:
                names.append(n)
        return names

    @property
    def fits(self) -> list[str]:
        return [n for s in self.sections for n in s.fit]


def _layouts(d: dict, source: str) -> dict[str, Layout]:
    out = {}
    for name, v in d.items():
        unknown = sorted(set(v) - {"label", "base", "ranks", *PARALLEL, *BATCH, *PERFORMANCE})
        if unknown or v.get("base") not in BASES or not isinstance(v.get("ranks"), int):
            raise ValueError(f"{source}: layout {name!r}: unknown keys {unknown}, or no base "
                             f"({sorted(BASES)}) or ranks")
        over = tuple((k, int(v[k])) for k in (*PARALLEL, *BATCH, *PERFORMANCE) if k in v)
        out[name] = Layout(name, str(v.get("label", name)), v["base"], v["ranks"], over)
    return out


def load_layouts(path: Path) -> dict[str, Layout]:
    """The [layouts] of a TOML file (the proof file, or `--extra FILE`)."""
    with Path(path).open("rb") as f:
        return _layouts(tomllib.load(f).get("layouts", {}), str(path))


def load(path: Path = PROOF) -> Proof:
    path = Path(path)
    text = path.read_text()
    d = tomllib.loads(text)
    layouts = _layouts(d.get("layouts", {}), str(path))
    sections = tuple(Section(k, v.get("title", k), tuple(v["fit"]), tuple(v.get("unseen", ())))
                     for k, v in d.get("sections", {}).items())
    core = d.get("core_share", {})
    pairs = tuple((a, b) for a, b in core.get("pairs", ()))
    named = [n for s in sections for n in s.layouts] + [n for p in pairs for n in p]
    missing = sorted({n for n in named if n not in layouts})
    if missing or not sections:
        raise ValueError(f"{path}: no section, or layouts named but not defined: {missing}")
    if core and core.get("calibration") not in {s.name for s in sections}:
        raise ValueError(f"{path}: [core_share] calibration must name a section")
    tol = d["tolerance"]
    return Proof(text=text, date=d["date"], steps=int(d["run"]["steps"]),
                 rounds=int(d["run"]["rounds"]), step_tol=float(tol["step"]),
                 component_tol=float(tol["component"]), negligible=float(tol["negligible"]),
                 components=tuple(tol["components"]), layouts=layouts, sections=sections,
                 core_calibration=core.get("calibration", ""), core_pairs=pairs)


def committed_config(layout: Layout, folder: Path) -> Path:
    """`folder`/config.toml: the layout over the repository's base config (a relative path, so
    the committed folder reads anywhere in a checkout), what the prediction reads."""
    folder.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(ROOT / "configs" / BASES[layout.base], folder)
    path = folder / "config.toml"
    path.write_text(f'base = "{base}"\n\n{layout.block()}')
    return path


def work_config(layout: Layout, work: Path) -> Path:
    """The profiled config: the layout over `work`'s base (the tiny data and checkpoints the
    bench wrote there)."""
    path = work / f"{layout.name}.toml"
    path.write_text(f'base = "{work}/base_{layout.base}.toml"\n\n{layout.block()}')
    return path
