"""What a calibration fits to: one measured step of one layout (`Summary`), read from a profile
folder (`read_profile.from_profile`) or from published figures.

* `CALIBRATION`: the one published measurement the default constants are fitted to, the
  128-rack step of Azure's MLPerf Training v6.0 write-up (GB200 NVL72, TP4-PP8-VP8-CP2, DP 128,
  MiniBS 8, GBS 1024, NVFP4): step time, compute time and the compute's GEMM and FFN shares,
  written as a summary (planner/published_128racks.toml), the same kind of input
  `plan --calibrate PROFILE_DIR` fits to.

No other published result (MFU at DP 8, the 7.07 and 18.79 minute scores, 83% scaling, the ~20 ms
of exposed cross-rack traffic) enters the model: those are predictions, tested in
tests/test_planner.py and bench/planner_vs_published.py.
"""
from __future__ import annotations

import statistics
import tomllib
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any

PUBLISHED = Path(__file__).resolve().parents[1] / "published_128racks.toml"
"""The published calibration point, as a profile summary (data; `Summary`)."""

COMPUTE_OF = ("busiest", "inner")
"""Which pipeline rank's compute a summary describes (`Summary.compute_of`)."""

KINDS = ("TP", "CP", "PP", "DP")
"""Communication kinds a summary may measure (the profile's parallel dimensions)."""


@dataclass(kw_only=True, frozen=True, slots=True)
class Summary:
    """What the solver fits to: one measured step of one layout, from a profile folder
    (`read_profile.from_profile`) or from published figures (`PUBLISHED`). The four figures every
    summary has (step, compute, GEMM and FFN shares of compute) are what the published write-up
    gives; a profile adds what it measures (each compute part, exposed communication by kind,
    the DP collectives' total, host gaps)."""
    source: str
    """Where the figures come from (a profile folder, or the publication)."""
    system: str
    model: str
    """The model's name (`model.name`)."""
    precision: str
    """The GEMM precision of the run (`precision.compute`)."""
    racks: int
    tp: int
    pp: int
    vp: int
    cp: int
    minibs: int
    mbs: int = 1
    config: str = ""
    """The profiled config file (a profile); empty: the planner's config of this layout."""
    step_s: float
    compute_s: float
    gemm_share_of_compute: float
    """GEMMs (with the attention core: the fused kernels count as GEMMs) in the compute."""
    ffn_share_of_compute: float
    parts: tuple[tuple[str, float], ...] = ()
    """Seconds per step of each compute part (compute.PARTS + "elementwise"), when measured."""
    exposed: tuple[tuple[str, float], ...] = ()
    """Exposed communication per step by kind (KINDS; PP includes the bubble), when measured."""
    dp_total_s: float | None = None
    """The DP collectives' total time per step, overlapped or not, when measured."""
    waiting: tuple[tuple[str, float], ...] = ()
    """Of the exposed communication, the time the compared ranks waited for a slower peer to
    arrive, by kind (KINDS; a profile's "waiting for peers", profile/waits.py), when measured."""
    host_s: float | None = None
    """Host gaps per step (nothing running), when measured."""
    memory_allocated_gb: float | None = None
    """Peak memory of the fullest GPU's tensors (torch.cuda.max_memory_allocated), when measured
    (a GPU profile; a CPU has no allocator record)."""
    memory_reserved_gb: float | None = None
    """Peak memory the caching allocator held on that GPU (torch.cuda.max_memory_reserved)."""
    eager_step_s: float | None = None
    """A profile of a run with full-iteration CUDA graphs: the eager step its trace measured. The
    figures above are then those of the replayed step (`graphed.as_replayed`); None: the run
    was not graphed."""
    compute_of: str = "busiest"
    """Which pipeline rank's compute the figures describe: "busiest" (a profile's compared
    stage, the busiest rank of the planner's breakdown) or "inner" (the busiest of the ranks
    holding neither the embedding nor the LM head: a write-up's figures of a typical GPU)."""
    probe_s: tuple[tuple[str, float], ...] = ()
    """Seconds of the precision probe a CPU profile's rank 0 ran (profile/probe.py), keyed
    "<operation>_<precision>" (gemm, attention; fp32, bf16): the machine's rate of each precision
    relative to another, where no datasheet gives it; () where none ran (a GPU profile)."""
    dp_exposed_s: float | None = None
    """Published only: exposed cross-rack DP (a check, never fitted)."""
    nvlink_critical_s: float | None = None
    """Published only: NVLink communication and bubbles on the critical path (a check)."""

    @property
    def closes(self) -> str:
        """The constant that closes the step: the host time per layer pass when the host gaps
        were measured (a profile), else the NVLink efficiency (the publication)."""
        return "host_s_per_layer_pass" if self.host_s is not None else "nvlink_bus_efficiency"

    @property
    def dp_transfer_s(self) -> float | None:
        """The DP collectives' time less the exposed waiting for the slowest replica in them (a
        profile splits off only the exposed: profile/waits.py): what the transport takes (model
        revision 11); the whole time where the waiting was not measured."""
        if self.dp_total_s is None:
            return None
        return max(0.0, self.dp_total_s - dict(self.waiting).get("DP", 0.0))

    @property
    def layout(self) -> str:
        return f"TP{self.tp}-PP{self.pp}-VP{self.vp}-CP{self.cp} MiniBS {self.minibs} MBS {self.mbs}"


def summary_from_dict(d: dict, source: str) -> Summary:
    """A Summary from its TOML/JSON form ([run] identity and layout, [measured] figures); a
    missing or unknown key is an error naming it and `source`."""
    flat = dict(d.get("run", {}))
    meas = dict(d.get("measured", {}))
    for k in ("parts", "exposed", "probe_s", "waiting"):
        if k in meas:
            meas[k] = tuple(sorted((str(a), float(b)) for a, b in meas[k].items()))
    flat.update(meas)
    names = {f.name for f in fields(Summary)}
    unknown = sorted(set(flat) - names)
    required = {f.name for f in fields(Summary) if f.default is MISSING}
    missing = sorted(required - set(flat) - {"source"})
    if unknown or missing:
        raise ValueError(f"{source}: not a profile summary: unknown keys {unknown}, missing keys "
                         f"{missing} (sections [run] and [measured])")
    if flat.get("compute_of", "busiest") not in COMPUTE_OF:
        raise ValueError(f"{source}: compute_of = {flat['compute_of']!r}: give one of "
                         f"{', '.join(COMPUTE_OF)} (the rank whose compute the figures describe)")
    flat.setdefault("source", source)
    return Summary(**flat)


def load_summary(path: Path) -> Summary:
    with Path(path).open("rb") as f:
        return summary_from_dict(tomllib.load(f), str(path))


CALIBRATION = load_summary(PUBLISHED)


def median_summary(summaries: list[Summary]) -> Summary:
    """One summary of several profiles of the same run: the median of each measured figure (a
    machine whose speed drifts between profiles meets the fit at its middle). Its source names
    every folder."""
    if len(summaries) == 1:
        return summaries[0]
    first = summaries[0]
    out: dict[str, Any] = {}  # Summary's fields, each of its own type
    for f in fields(Summary):
        vals = [getattr(s, f.name) for s in summaries]
        if f.name in ("parts", "exposed", "probe_s", "waiting"):
            keys = sorted({k for v in vals for k, _ in v})
            out[f.name] = tuple((k, statistics.median(dict(v).get(k, 0.0) for v in vals))
                                for k in keys)
        elif isinstance(vals[0], float) and all(isinstance(v, float) for v in vals):
            out[f.name] = statistics.median(vals)
    parts: dict[str, float] = dict(out.get("parts", ()))
    if parts:  # the compute and its shares: of the median parts, so that they add up
        compute_s = sum(parts.values())
        out.update(compute_s=compute_s,
                   gemm_share_of_compute=(compute_s - parts.get("elementwise", 0.0)) / compute_s,
                   ffn_share_of_compute=(parts.get("ffn_up", 0.0) + parts.get("ffn_down", 0.0))
                   / compute_s)
    return replace(first, **out, source="median of " + ", ".join(s.source for s in summaries))
