"""Reference convergence points: which RCP covers a GBS, the RCP check of a set of runs, and the
project's tiny RCP file.

The numbers and the statistics are mlperf_logging.rcp_checker's own (`RCP_Checker`: olympic mean,
pruning, interpolation, the t-test bound on speed-up, the llama31_405b 46080-sample allowance).
For llama31_405b the package's `training_<R>/rcps_llama31_405b.json` is used. For the tiny benchmark
the stock command line cannot run (`python -m mlperf_logging.rcp_checker --custom_rcps` looks the
benchmark up in its own run-count table and reads non-MLPerf logs by `epoch_num`, so it raises
KeyError for tiny_llama31); `check_runs` therefore registers tiny_llama31's run count with the
checker, reads samples-to-converge the way the checker does for llama31_405b (samples_count of the
last evaluation before a successful run_stop) and takes the same decisions as its
`check_directory`, with the checker's own methods. A test shows both agree on the real logs.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..config.rcp import TINY_RCP_FILE, rcp_file_for
from ..config.rules import TINY_LLAMA31
from ..mlperf.checker import RULESET, USAGE
from ..mlperf.log import RunLog

RUNS_PER_SUBMISSION = {TINY_LLAMA31.name: 3}


@dataclass(frozen=True, slots=True)
class RcpRef:
    kind: str
    """'found' (an RCP at this GBS), 'interpolated', 'below' (GBS under the smallest RCP: compared
    with it, a run must not be faster), 'missing' (no RCP above: fails), 'none'."""
    gbs: int
    mean: float | None = None
    stdev: float | None = None
    min_samples: float | None = None
    """Fastest acceptable mean samples-to-converge (RCP mean / max speed-up)."""
    ref_gbs: int | None = None

    @property
    def covered(self) -> bool:
        return self.kind in ("found", "interpolated", "below")

    def describe(self) -> str:
        if self.kind == "found":
            return f"RCP at GBS {self.gbs}: mean {self.mean:,.0f} samples"
        if self.kind == "interpolated":
            return f"RCP interpolated at GBS {self.gbs}: mean {self.mean:,.0f} samples"
        if self.kind == "below":
            return (f"GBS {self.gbs} is below the smallest RCP (GBS {self.ref_gbs}, mean "
                    f"{self.mean:,.0f} samples): the checker accepts runs that are not faster than "
                    "it; the rules text asks for a new RCP at this GBS")
        if self.kind == "missing":
            return (f"GBS {self.gbs} is above every RCP (largest GBS {self.ref_gbs}): the RCP "
                    "checker fails it ('Missing RCP')")
        return f"no RCPs for GBS {self.gbs}"


def make_checker(benchmark: str, ruleset: str = RULESET, rcp_file: str | Path | None = None):
    """mlperf_logging's RCP_Checker loaded with the benchmark's RCPs (project file for tiny)."""
    from mlperf_logging.rcp_checker import rcp_checker as rc
    if benchmark in RUNS_PER_SUBMISSION:
        # the checker's table of runs per submission only knows MLPerf benchmarks
        rc.submission_runs[USAGE].setdefault(benchmark, RUNS_PER_SUBMISSION[benchmark])
    path = Path(rcp_file) if rcp_file else rcp_file_for(benchmark, ruleset)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no reference convergence points for {benchmark} "
                                f"(ruleset {ruleset})")
    with path.open() as f:
        return rc.RCP_Checker(USAGE, ruleset, benchmark, False, rcp_file=f)


def _plain(x) -> float:
    return float(x)


def _min_samples(ck, rec: dict) -> float:
    """The fastest mean the checker accepts, including its llama31_405b allowance (5.0.0 on:
    46,080 samples more speed-up than the t-test bound)."""
    from mlperf_logging.rcp_checker import rcp_checker as rc
    if ck.benchmark == "llama31_405b" and rc.is_version_at_least(ck.ruleset, "5.0.0"):
        return float(rec["Min Epochs"]) - 46080.0
    return float(rec["Min Epochs"])


def reference(benchmark: str, gbs: int, ruleset: str = RULESET,
              rcp_file: str | Path | None = None, checker=None) -> RcpRef:
    """The RCP the checker compares runs at `gbs` with (pruned RCPs, as the package checker)."""
    ck = checker or make_checker(benchmark, ruleset, rcp_file)
    rp = "pruned_rcps"
    rec = ck._find_rcp(gbs, rp)
    if rec is not None:
        return RcpRef("found", gbs, _plain(rec["RCP Mean"]), _plain(rec["RCP Stdev"]),
                      _min_samples(ck, rec), gbs)
    lo, hi = ck._find_top_min_rcp(gbs, rp), ck._find_bottom_max_rcp(gbs, rp)
    if lo is not None and hi is not None:
        _, rec = ck._create_interp_rcp(gbs, lo, hi)
        return RcpRef("interpolated", gbs, _plain(rec["RCP Mean"]), _plain(rec["RCP Stdev"]),
                      _min_samples(ck, rec), gbs)
    if lo is None and hi is not None:
        rec = ck._find_min_rcp(rp)
        return RcpRef("below", gbs, _plain(rec["RCP Mean"]), _plain(rec["RCP Stdev"]),
                      _plain(rec["RCP Mean"]), int(rec["BS"]))
    if lo is not None:
        return RcpRef("missing", gbs, ref_gbs=int(lo["BS"]))
    return RcpRef("none", gbs)


@dataclass(frozen=True, slots=True)
class RcpResult:
    ok: bool
    message: str
    """The checker's message ('RCP found', 'Insufficient convergence', ...)."""
    norm_factor: float
    """Score scaling for runs faster than the RCP mean (1.0 otherwise)."""
    samples: list[float | None]
    ref: RcpRef | None


def check_runs(runs: list[RunLog], *, ruleset: str = RULESET,
               rcp_file: str | Path | None = None, results_dir: str | Path | None = None) -> RcpResult:
    """The RCP checker's `check_directory` decision for these runs (pruned RCPs). With
    results_dir, writes/removes scaling.json there as the checker does."""
    benches = {r.benchmark for r in runs}
    gbss = {r.gbs for r in runs}
    bench = next(iter(benches)) if len(benches) == 1 else None
    gbs = next(iter(gbss)) if len(gbss) == 1 else None
    if bench is None or gbs is None:
        msg = ("Benchmark names in files do not match" if len(benches) != 1 else
               "Could not detect global_batch_size" if None in gbss else
               "Batch sizes in files do not match" if len(gbss) != 1 else
               "Could not detect submission_benchmark")
        return RcpResult(False, msg, 1.0, [], None)
    ck = make_checker(bench, ruleset, rcp_file)
    samples = [r.samples_to_converge for r in runs]
    not_converged = sum(s is None for s in samples)
    if not_converged > 1:
        return RcpResult(False, "Insufficient convergence", 1.0, samples, None)
    subm = [1e9 if s is None else s for s in samples]
    ref = reference(bench, gbs, ruleset, rcp_file, checker=ck)
    out_dir = str(results_dir) if results_dir else ""
    rp = "pruned_rcps"
    if ref.kind == "found":
        ok, norm = ck._eval_submission_record(ck._find_rcp(gbs, rp), subm, out_dir)
        msg = "RCP found"
    elif ref.kind == "interpolated":
        _, rec = ck._create_interp_rcp(gbs, ck._find_top_min_rcp(gbs, rp), ck._find_bottom_max_rcp(gbs, rp))
        ok, norm = ck._eval_submission_record(rec, subm, out_dir)
        msg = "RCP Interpolation"
    elif ref.kind == "below":
        ok, norm = ck._eval_submission_record(ck._find_min_rcp(rp), subm, out_dir)
        msg = ("RCP not found but slower convergence on smaller batch size" if ok
               else f"Missing RCP, please submit RCP with BS = {gbs}")
    elif ref.kind == "missing":
        ok, norm, msg = False, 1.0, f"Missing RCP, please submit RCP with BS = {gbs}"
    else:
        ok, norm, msg = False, 1.0, "Cannot find any RCPs"
    return RcpResult(bool(ok), msg, float(norm), samples, ref)


# --- the project's tiny RCP file ----------------------------------------------------------------

def rcp_records(runs: list[RunLog], *, creator: str, when: str, platform: str,
                precision: str) -> dict:
    """RCP records in the checker's JSON format, one per GBS, from converged runs."""
    by_gbs: dict[int, list[tuple[RunLog, float]]] = {}
    for r in runs:
        samples, gbs = r.samples_to_converge, r.gbs
        if samples is None:
            raise ValueError(f"{r.path}: run did not converge (run_stop status {r.status!r}); "
                             "an RCP needs converged runs only")
        if gbs is None:
            raise ValueError(f"{r.path}: no global_batch_size logged; an RCP is per batch size")
        by_gbs.setdefault(gbs, []).append((r, samples))
    out = {}
    for gbs, converged in sorted(by_gbs.items()):
        rs = [r for r, _ in converged]
        bench = rs[0].benchmark
        if len(rs) < 3:
            raise ValueError(f"GBS {gbs}: {len(rs)} converged run(s); the checker's olympic mean "
                             "drops the best and the worst, so an RCP needs at least 3 (MLPerf "
                             "asks for twice the submission's runs)")
        first = rs[0]
        out[f"{bench}_ref_{gbs}"] = {
            "Benchmark": bench, "Creator": creator, "When": when, "Platform": platform,
            "Precision": precision, "BS": gbs,
            "Hyperparams": {
                "opt_base_learning_rate": first.value("opt_base_learning_rate"),
                "opt_learning_rate_warmup_steps": first.value("opt_learning_rate_warmup_steps"),
                "gradient_accumulation_steps": first.value("gradient_accumulation_steps"),
            },
            "Epochs to converge": [int(samples) for _, samples in converged],
        }
    return out


def write_rcps(records: dict, path: str | Path = TINY_RCP_FILE, *, unique: bool = False) -> Path:
    """Create the RCP file `path` (never over an existing one: OutputExists; with `unique`, a
    default path, the next free `<stem>-N.json`). Returns the path taken."""
    from ..outputs import create_exclusive
    return create_exclusive(path, json.dumps(records, indent=2) + "\n", unique=unique,
                            advice="give another --out, or move the earlier file away")


def olympic_score(minutes: list[float | None], factor: float = 1.0) -> float | None:
    """The result summarizer's olympic mean (its own function): drop best and worst; a run that
    did not finish counts as dropped (one may, for llama31_405b)."""
    from mlperf_logging.result_summarizer.result_summarizer import _compute_olympic_average
    good = [m for m in minutes if m is not None]
    dropped = len(minutes) - len(good)
    if dropped > 1 or not good:
        return None
    avg = _compute_olympic_average(sorted(good), dropped, 1)
    return None if avg is None or math.isnan(avg) else avg * factor
