"""Reference convergence points as the config needs them: the mean samples-to-converge that the
MLPerf RCP checker compares a run at a given GBS with, and the `run.max_steps` cap derived from it.

The RCP files are mlperf-logging's `rcp_checker/training_<ruleset>/rcps_<benchmark>.json` for
llama31_405b and the project's `compliance/tiny_llama31_rcps.json` for the tiny benchmark. The
statistics are those of `mlperf_logging.rcp_checker.RCP_Checker` (`compute_rcp_stats`: olympic
mean; `_prune_rcps`; `_create_interp_rcp`: linear interpolation between the neighbouring pruned
RCPs; a GBS below every RCP is compared with the smallest one), written out here without numpy
and scipy so that loading a config stays cheap; tests/test_rcp_lookup.py compares the two at every
batch size. The planner reads the same pruned RCPs with their spread (`pruned_stats`). The
checker's own decisions on finished runs live in `submission.rcp`.

Data bound (`samples_bound`): a closed-division run asks the dataset for max_steps x GBS samples
(the whole LR schedule when run.max_steps is unset, 1.38 billion at GBS 1152: an index that takes
hours to build at init). `config.validate` refuses more than `RCP_MULTIPLE` x the RCP mean.
Cap rule (`max_steps_for`): the largest multiple of `MAX_STEPS_ROUNDING` steps within that bound:
500 at GBS 1152, where the GB200 runs converge in ~272-290 steps (the first evaluation is at step
240), and at most 1000 for every GB200 config (GBS >= 640).
"""
from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .rules import RULESET

REPO = Path(__file__).resolve().parents[2]
TINY_RCP_FILE = REPO / "compliance" / "tiny_llama31_rcps.json"
PROJECT_RCPS = {"tiny_llama31": TINY_RCP_FILE}
"""Benchmarks of this project that are not MLPerf benchmarks, and their RCP file."""

RCP_MULTIPLE = 2
"""Samples a closed-division run may request: at most this many times the RCP mean."""
MAX_STEPS_ROUNDING = 50


@cache
def rcp_file_for(benchmark: str, ruleset: str = RULESET) -> Path:
    """The RCP file of a benchmark: the project's for tiny_llama31, mlperf-logging's otherwise."""
    if benchmark in PROJECT_RCPS:
        return PROJECT_RCPS[benchmark]
    spec = importlib.util.find_spec("mlperf_logging")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("mlperf-logging is not installed: no RCP file for " + benchmark)
    root = Path(list(spec.submodule_search_locations)[0])
    return root / "rcp_checker" / f"training_{ruleset}" / f"rcps_{benchmark}.json"


@dataclass(frozen=True, slots=True)
class RcpMean:
    gbs: int
    mean: float
    """Mean samples-to-converge the checker compares runs at `gbs` with."""
    kind: str
    """'found' (an RCP at this GBS), 'interpolated', 'below' (smaller than every RCP: the smallest
    one's mean) or 'above' (larger than every RCP: the largest one's mean; the checker reports a
    missing RCP there)."""
    file: Path

    def describe(self) -> str:
        how = {"found": "RCP", "interpolated": "RCP interpolated",
               "below": "smallest RCP (the checker's reference below it)",
               "above": "largest RCP (no RCP covers this GBS)"}[self.kind]
        return f"{how} mean {self.mean:,.0f} samples at GBS {self.gbs} ({shown(self.file)})"


def shown(path: Path) -> str:
    """An RCP file as a user finds it: relative to the repository, or inside mlperf_logging."""
    parts = path.parts
    if "mlperf_logging" in parts:
        return "/".join(parts[len(parts) - 1 - parts[::-1].index("mlperf_logging"):])
    if path.is_relative_to(REPO):
        return str(path.relative_to(REPO))
    return str(path)


def _olympic_mean(samples: list[float]) -> float:
    s = sorted(samples)[1:-1]
    return sum(s) / len(s)


def _interp(bs: int, lo: tuple[int, float], hi: tuple[int, float]) -> float:
    slope = (hi[1] - lo[1]) / (hi[0] - lo[0])
    return slope * (bs - lo[0]) + lo[1]


def _stdev(samples: list[float]) -> float:
    """The checker's spread of an RCP: the population standard deviation of all its runs."""
    mean = sum(samples) / len(samples)
    return math.sqrt(sum((x - mean) ** 2 for x in samples) / len(samples))


@cache
def pruned_stats(path: Path) -> tuple[tuple[int, float, float], ...]:
    """(GBS, olympic mean, standard deviation) of the RCPs the checker keeps after pruning, by
    GBS (its 'RCP Mean' and 'RCP Stdev')."""
    with Path(path).open() as f:
        raw = json.load(f)
    pts = []
    for r in raw.values():
        runs = [float(x) for x in (r.get("Epochs to converge") or r["samples to converge"])]
        pts.append((int(r["BS"]), _olympic_mean(runs), _stdev(runs)))
    pts.sort()
    fastest = min(pts, key=lambda p: p[1])
    pts = [p for p in pts if p[0] >= fastest[0]]
    i = 1
    while i < len(pts) - 1:
        if pts[i][1] > _interp(pts[i][0], pts[i - 1][:2], pts[i + 1][:2]):
            del pts[i]
            i -= 1
        i += 1
    return tuple(pts)


def pruned_points(path: Path) -> tuple[tuple[int, float], ...]:
    """(GBS, olympic mean) of the RCPs the checker keeps after pruning, by GBS."""
    return tuple((bs, mean) for bs, mean, _ in pruned_stats(path))


@cache
def rcp_mean(benchmark: str, gbs: int, ruleset: str = RULESET) -> RcpMean:
    path = rcp_file_for(benchmark, ruleset)
    pts = pruned_points(path)
    for bs, mean in pts:
        if bs == gbs:
            return RcpMean(gbs, mean, "found", path)
    lo = max((p for p in pts if p[0] < gbs), default=None)
    hi = min((p for p in pts if p[0] > gbs), default=None)
    if lo and hi:
        return RcpMean(gbs, _interp(gbs, lo, hi), "interpolated", path)
    if hi:
        return RcpMean(gbs, pts[0][1], "below", path)
    return RcpMean(gbs, pts[-1][1], "above", path)


def samples_bound(benchmark: str, gbs: int) -> float:
    """The most samples a closed-division run at `gbs` may ask the dataset for."""
    return RCP_MULTIPLE * rcp_mean(benchmark, gbs).mean


def max_steps_for(benchmark: str, gbs: int) -> int:
    """The run.max_steps of a shipped config: the largest multiple of MAX_STEPS_ROUNDING steps
    whose samples stay within `samples_bound` (500 at GBS 1152; 400 to 650 steps over the GB200
    configs' GBS 896..1536, 350 for the tiny benchmark at GBS 8)."""
    return math.floor(samples_bound(benchmark, gbs) / gbs / MAX_STEPS_ROUNDING) * MAX_STEPS_ROUNDING
