"""Finished runs -> a checked MLPerf submission package.

Layout (what the package checker and result summarizer walk):
  <out>/<org>/results/<system>/<benchmark>/result_{0,1,2}.txt
  <out>/<org>/systems/<system>.json
  <out>/<org>/benchmarks/<benchmark>/implementations/<impl>/   (a clean copy of the code)
The package checker of mlperf-logging 4.1.68 reads results/ and systems/ (it lists source files
under benchmarks/<benchmark> but checks nothing there); the code copy is for the submission itself.

Before the checkers run, every log is read (`mlperf.log`: one run per file, no malformed or
damaged line), and what they would refuse is refused here with the file named: more than one run
without a successful run_stop, more than one log failing the compliance rules, mixed benchmarks
or batch sizes, logs of more than one system, or logs that do not match the config or the system
description (`identity`: the submission_* events). Then, for an MLPerf benchmark: the package
checker, the RCP checker and the result summarizer, as subprocesses with their own command lines; their output is scanned so a
skipped check ("Skipping", a tolerated failure) is never reported as a pass. For the tiny
benchmark, which the package checker would skip: the system description checker, the compliance
checker with the tiny rules, the seed checker and the RCP checker with the project's RCPs.
"""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..mlperf.checker import REPO, RULESET, USAGE, check_log
from ..mlperf.log import RunLog, read_events
from . import identity

TEMPLATE = REPO / "compliance" / "system_description.json"
STATUS = {"available": "Available on-premise", "onprem": "Available on-premise",
          "cloud": "Available cloud", "preview": "Preview",
          "research": "Research, Development, or Internal (RDI)"}


class PackageError(RuntimeError):
    """The package is refused; the message names the files and the reasons."""


@dataclass(slots=True)
class Step:
    name: str
    ok: bool
    detail: str
    skipped: bool = False

    def line(self) -> str:
        tag = "SKIP" if self.skipped else ("PASS" if self.ok else "FAIL")
        return f"{tag} {self.name}: {self.detail}"


@dataclass(slots=True)
class PackageResult:
    org_dir: Path
    benchmark: str
    system: str
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    score_min: float | None = None
    runs: list[RunLog] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.ok and not s.skipped for s in self.steps)


# --- inputs -------------------------------------------------------------------------------------

def find_logs(logs_dir: str | Path) -> list[Path]:
    """result_*.txt in DIR, else every file in DIR with MLLOG lines (sorted by name)."""
    d = Path(logs_dir)
    if not d.is_dir():
        raise PackageError(f"{d}: not a directory")
    files = sorted(d.glob("result_*.txt"))
    if not files:
        files = sorted(p for p in d.iterdir() if p.is_file() and p.suffix in (".txt", ".log")
                       and b":::MLLOG " in p.read_bytes())
    if not files:
        raise PackageError(f"{d}: no result_*.txt and no file with ':::MLLOG ' lines")
    return files


def read_runs(files: list[Path]) -> list[RunLog]:
    runs, bad = [], []
    for f in files:
        events, problems = read_events(f)
        if problems:
            bad += [str(p) for p in problems]
        if not events:
            bad.append(f"{f}: no ':::MLLOG ' lines")
        runs.append(RunLog(path=str(f), events=events, problems=problems))
    if bad:
        raise PackageError("logs that cannot be read as one run each:\n  " + "\n  ".join(bad))
    return runs


def run_count(benchmark: str) -> int:
    from mlperf_logging.benchmark_meta import get_result_file_counts
    from .rcp import RUNS_PER_SUBMISSION
    return RUNS_PER_SUBMISSION.get(benchmark) or get_result_file_counts(USAGE)[benchmark]


def validate_runs(runs: list[RunLog], cfg=None) -> tuple[str, list[str]]:
    """(benchmark, warnings); PackageError for what the checkers would refuse."""
    benches = {r.benchmark for r in runs}
    bench = benches.pop() if len(benches) == 1 else None
    if bench is None:
        raise PackageError("logs disagree on submission_benchmark: " + ", ".join(
            f"{r.path}={r.benchmark!r}" for r in runs))
    want = run_count(bench) if _known(bench) else None
    if want is not None and len(runs) != want:
        raise PackageError(f"{len(runs)} logs for {bench}; a submission has exactly {want} "
                           f"({', '.join(r.path for r in runs)})")
    gbss = {r.gbs for r in runs}
    if len(gbss) != 1:
        raise PackageError("logs disagree on global_batch_size: " + ", ".join(
            f"{r.path}={r.gbs}" for r in runs))
    if cfg is not None:
        d = cfg.derived
        if bench != d.rules.name or runs[0].gbs != d.gbs:
            raise PackageError(f"logs are {bench} at GBS {runs[0].gbs}, config {cfg.source} is "
                               f"{d.rules.name} at GBS {d.gbs}: wrong --config or --logs")
    # converged: mlperf.verdict (run_stop success AND an evaluation at the target)
    failed = [r for r in runs if not r.converged]
    why = {r.path: r.convergence().words for r in failed}
    if len(failed) > 1:
        raise PackageError(f"{len(failed)} of {len(runs)} runs did not converge (run_stop status "
                           "success after an evaluation at the target); the checkers tolerate "
                           "one:\n  " +
                           "\n  ".join(f"{p}: {w}" for p, w in why.items()))
    if any(r.seed is None for r in runs):
        raise PackageError("no seed logged in: " + ", ".join(r.path for r in runs if r.seed is None))
    # the seed checker's rule: no two runs log the same seed from the same source line (the
    # event's metadata file and lineno: where the LOGGING SCRIPT logged it, not a line of the log)
    where: dict[tuple, str] = {}
    for r in runs:
        e = r.first("seed")
        assert e is not None    # its value was found above
        key = (e.metadata.get("file"), e.metadata.get("lineno"), str(e.value))
        if key in where:
            raise PackageError(
                f"{r.path}:{e.lineno} logs seed {e.value}, as {where[key]} does, both from the "
                f"same source line of the logging script ({key[0]}:{key[1]}, the event's "
                "metadata): every run needs its own seed")
        where[key] = f"{r.path}:{e.lineno}"
    return bench, [f"{p}: {w} (tolerated: one of {len(runs)} runs may fail)" for p, w in why.items()]


def _known(benchmark: str) -> bool:
    from mlperf_logging.benchmark_meta import get_result_file_counts
    from .rcp import RUNS_PER_SUBMISSION
    return benchmark in RUNS_PER_SUBMISSION or benchmark in get_result_file_counts(USAGE)


# --- layout -------------------------------------------------------------------------------------

def system_description(cfg, org: str, template: Path = TEMPLATE) -> dict:
    """systems/<system>.json: hardware from llama31_405b/systems, the rest from the template."""
    d = cfg.derived
    s = d.system
    desc = {
        "submitter": org, "division": cfg.run.division, "status": STATUS[cfg.run.status],
        "system_name": f"{d.nodes}x {s.name}" if d.nodes > 1 else s.name,
        "number_of_nodes": str(d.nodes),
        "host_processors_per_node": str(s.host_processors_per_node),
        "host_processor_model_name": s.host_processor_model_name,
        "host_processor_core_count": str(s.cpu_cores_per_node),
        "host_memory_capacity": f"{s.host_memory_gb:g} GB",
        "host_networking": s.interconnect,
        "accelerators_per_node": str(s.gpus_per_node if s.is_gpu else 0),
        "accelerator_model_name": s.accelerator,
        "accelerator_host_interconnect": s.accelerator_host_interconnect,
        "accelerator_memory_capacity": f"{s.hbm_gb:g} GB",
        "accelerator_interconnect": f"NVLink {2 * s.nvlink_gbs:g} GB/s bidirectional per GPU"
                                    if s.is_gpu else "none",
        "accelerator_interconnect_topology": (
            "none" if not s.is_gpu else f"NVLink domain of {s.gpus_per_nvlink_domain} GPUs (one "
            "node)" if s.node_nvlink_domain else f"NVLink domain of {s.gpus_per_nvlink_domain} "
            f"GPUs, {d.gpus_per_rack} used per rack"),
        "cooling": s.cooling,
    }
    try:
        extra = json.loads(template.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PackageError(f"{template}: cannot read the system description template: {e}") from None
    desc.update({k: v for k, v in extra.items() if not k.startswith("_")})
    return desc


def code_files(root: Path = REPO) -> list[Path]:
    """The repository's own files: git's tracked + untracked-not-ignored, else the package,
    configs, compliance rules, scripts and build files (never the venv, data or outputs)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], capture_output=True, check=True, timeout=60)
        names = [n for n in out.stdout.decode().split("\0") if n]
        return [root / n for n in names if (root / n).is_file() and not (root / n).is_symlink()]
    except (OSError, subprocess.SubprocessError):
        keep = ["llama31_405b", "configs", "compliance", "scripts", "docs", "tests", "bench",
                "constraints"]
        files = [p for k in keep if (root / k).is_dir() for p in (root / k).rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
        return files + [root / n for n in ("pyproject.toml", "Makefile", "README.md",
                                           "Dockerfile", "run_and_time.sh", ".dockerignore")
                        if (root / n).is_file()]


def _desc_text(desc: dict) -> str:
    return json.dumps(desc, indent=4) + "\n"


def refuse_earlier_package(*, out: Path, org: str, system: str, desc: dict, benchmark: str) -> None:
    """A submission tree holds other systems' and benchmarks' results beside this package's:
    nothing in it is deleted or replaced. Refused: results of this system and benchmark already
    there, or another description of this system (PackageError, before any checker runs)."""
    res_dir = out / org / "results" / system / benchmark
    if res_dir.exists():
        raise PackageError(f"{res_dir} already holds results (an earlier package): a result file is "
                           "never replaced; choose a new --out, or move that folder away first")
    sys_json = out / org / "systems" / f"{system}.json"
    if sys_json.exists() and sys_json.read_text() != _desc_text(desc):
        raise PackageError(f"{sys_json} already describes system {system!r} otherwise: choose a "
                           "new --out, or make the descriptions agree")


def code_differs(impl_dir: Path, root: Path = REPO) -> str | None:
    """Why the implementation folder `impl_dir`, written by an earlier package, is not this
    checkout's code (a file added, removed or changed; its first), or None: the same code."""
    if not impl_dir.exists():
        return None
    ours = {str(f.relative_to(root)): f for f in code_files(root)}
    theirs = {str(p.relative_to(impl_dir)) for p in impl_dir.rglob("*") if p.is_file()}
    for name in sorted(ours.keys() ^ theirs):
        return f"{name} {'is new in this checkout' if name in ours else 'is gone from it'}"
    for name in sorted(ours):
        if ours[name].read_bytes() != (impl_dir / name).read_bytes():
            return f"{name} differs"
    return None


def refuse_other_code(impl_dir: Path) -> None:
    why = code_differs(impl_dir)
    if why:
        raise PackageError(f"{impl_dir} holds the code of an earlier package, not this checkout's "
                           f"({why}): the earlier system's results were made with it, kept; "
                           "package into a new --out, or give another --impl name")


def assemble(runs: list[RunLog], *, out: Path, org: str, system: str, desc: dict,
             benchmark: str, impl: str) -> Path:
    """Results, system description and code, each put in place whole and never over another
    package's: the results folder and the code folder are written under temporary names and
    moved in by renameat2(RENAME_NOREPLACE) (outputs.publish); of two packages of one system
    at once, the second is refused there."""
    from ..outputs import OutputExists, create_exclusive, mkdir_exclusive, publish, temp_sibling
    org_dir = out / org
    refuse_earlier_package(out=out, org=org, system=system, desc=desc, benchmark=benchmark)
    impl_dir = org_dir / "benchmarks" / benchmark / "implementations" / impl
    refuse_other_code(impl_dir)
    res_dir = org_dir / "results" / system / benchmark
    tmp = mkdir_exclusive(temp_sibling(res_dir))
    for i, r in enumerate(runs):
        create_exclusive(tmp / f"result_{i}.txt", Path(r.path).read_bytes())
    try:
        publish(tmp, res_dir, advice="an earlier (or concurrent) package of this system and "
                "benchmark: choose a new --out, or move that folder away first")
    except OutputExists as e:
        raise PackageError(f"{e} (this package's results are left in {tmp})") from None
    sys_json = org_dir / "systems" / f"{system}.json"
    try:
        create_exclusive(sys_json, _desc_text(desc))
    except OutputExists:
        if sys_json.read_text() != _desc_text(desc):
            raise PackageError(f"{sys_json} already describes system {system!r} otherwise: choose "
                               "a new --out, or make the descriptions agree") from None
    if not impl_dir.exists():
        code = mkdir_exclusive(temp_sibling(impl_dir))
        for f in code_files():
            dst = code / f.relative_to(REPO)
            dst.parent.mkdir(parents=True, exist_ok=True)
            create_exclusive(dst, f.read_bytes())
        try:
            publish(code, impl_dir)
        except OutputExists:        # another package put its code there meanwhile
            refuse_other_code(impl_dir)     # other code: refused (this copy left in `code`)
            shutil.rmtree(code)             # the same code: this process's own spare copy
    return org_dir


def claim_check_files(out: Path) -> dict[str, Path]:
    """package_checker.log, rcp_checker.log, summary.csv (and the summarizer's summary.json)
    for this package: once the tree holds them (an earlier package's), package_checker-2.log,
    ...: the first set none of whose files exists, each created exclusively (empty; the checkers
    fill them). An earlier package's verdicts are never replaced, nor read as this one's."""
    from ..outputs import candidates, create_exclusive
    for base in candidates(out / "x"):
        sfx = base.name[1:]
        paths = dict(package=out / f"package_checker{sfx}.log", rcp=out / f"rcp_checker{sfx}.log",
                     csv=out / f"summary{sfx}.csv", json=out / f"summary{sfx}.json")
        if any(p.exists() for p in paths.values()):
            continue
        try:
            for p in paths.values():
                create_exclusive(p, "")
        except FileExistsError:
            continue
        return paths
    raise AssertionError("unreachable")


# --- checkers -----------------------------------------------------------------------------------

def _run(args: list[str], cwd: Path) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=600)
    return p.returncode, p.stdout + p.stderr


def _problems(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines()
            if ln.startswith(("ERROR", "CRITICAL")) or "Skipping" in ln or "ERROR:" in ln
            or "CRITICAL ERROR" in ln or "Traceback" in ln]


def run_package_checker(org_dir: Path, ruleset: str, log_output: Path | None = None) -> Step:
    org_dir = Path(org_dir).absolute()   # the checkers run in another folder (_run's cwd)
    log_output = Path(log_output or org_dir.parent / "package_checker.log").absolute()
    rc, text = _run(["mlperf_logging.package_checker", str(org_dir), USAGE, ruleset,
                     "--log_output", str(log_output)], org_dir.parent)
    probs = _problems(text)
    warned = [ln.strip() for ln in text.splitlines() if ln.startswith("WARNING")]
    skipped = any("Skipping" in ln for ln in probs)
    ok = rc == 0 and "PACKAGE CHECKER FOUND NO ERRORS" in text and not probs
    detail = "found no errors" if ok else "; ".join(probs or ["did not report success"])
    if warned:
        detail += " (warnings: " + "; ".join(warned) + ")"
    return Step("package checker", ok and not skipped, detail, skipped=skipped)


def run_rcp_checker(res_dir: Path, ruleset: str, log_output: Path | None = None) -> Step:
    res_dir = Path(res_dir).absolute()   # the checker runs in another folder (_run's cwd)
    log_output = Path(log_output or res_dir.parents[3] / "rcp_checker.log").absolute()
    rc, text = _run(["mlperf_logging.rcp_checker", str(res_dir), "--rcp_version", ruleset,
                     "--log_output", str(log_output)], res_dir.parents[3])
    verdict = next((ln.strip().removeprefix("INFO - ").removeprefix("ERROR - ") for ln in text.splitlines()
                    if "RCP test" in ln), text.strip()[-300:])
    return Step("RCP checker", rc == 0 and "PASSED" in verdict, verdict)


def run_summarizer(org_dir: Path, benchmark: str, ruleset: str, out_csv: Path | None = None,
                   system_name: str | None = None) -> tuple[Step, float | None]:
    """The result summarizer's score of `benchmark`; with several systems of it in the tree,
    the row of `system_name` (the description's), none when that is not one row."""
    org_dir = Path(org_dir).absolute()   # the summarizer runs in another folder (_run's cwd)
    out_csv = Path(out_csv or org_dir.parent / "summary.csv").absolute()
    rc, text = _run(["mlperf_logging.result_summarizer", str(org_dir), USAGE, ruleset,
                     "--csv", str(out_csv)], org_dir.parent)
    probs = _problems(text)
    score = None
    if out_csv.is_file():
        with out_csv.open() as f:
            rows = list(csv.DictReader(f))
        scored = [r for r in rows if r.get(benchmark)]
        if len(scored) > 1:        # another system's score of this benchmark beside ours
            scored = [r for r in scored if system_name and r.get("system") == system_name]
        score = float(scored[0][benchmark]) if len(scored) == 1 else None
    ok = rc == 0 and score is not None and not probs
    notices = [ln.strip() for ln in text.splitlines() if ln.startswith("NOTICE")]
    detail = (f"{benchmark} score {score:.3f} min" if score is not None else "no score") + (
        "; " + "; ".join(probs + notices) if probs or notices else "")
    return Step("result summarizer", ok, detail), score


def tiny_checks(org_dir: Path, res_dir: Path, runs: list[RunLog], desc_path: Path,
                ruleset: str) -> tuple[list[Step], float | None]:
    """The package checker's parts for a benchmark it does not know (it would skip it)."""
    import logging

    from mlperf_logging.package_checker.seed_checker import SeedChecker
    from mlperf_logging.system_desc_checker import system_desc_checker

    from .rcp import check_runs, olympic_score

    steps = []
    root = logging.getLogger()
    old = root.level
    root.setLevel(logging.CRITICAL)   # their INFO chatter; verdicts are the return values
    try:
        ok, *_ = system_desc_checker.check_system_desc(str(desc_path), USAGE, ruleset)
        steps.append(Step("system description checker", bool(ok), desc_path.name))
        files = sorted(str(p) for p in res_dir.glob("result_*.txt"))
        seed_ok = SeedChecker(ruleset).check_seeds(files)
        steps.append(Step("seed checker", bool(seed_ok), f"{len(files)} runs, seeds "
                          f"{[r.seed for r in runs]}"))
    finally:
        root.setLevel(old)
    rcp = check_runs([RunLog(path=str(p), events=r.events) for p, r in
                      zip(sorted(res_dir.glob("result_*.txt")), runs)],
                     ruleset=ruleset, results_dir=res_dir)
    steps.append(Step("RCP checker (project RCPs, compliance/tiny_llama31_rcps.json)", rcp.ok,
                      f"{rcp.message}; samples to converge {rcp.samples}; "
                      f"normalisation {rcp.norm_factor:.4f}"))
    score = olympic_score([r.convergence().minutes for r in runs], rcp.norm_factor)
    return steps, score


def _agree_on_score(res: PackageResult, runs: list[RunLog], ruleset: str,
                    compliant: set[str] | None = None) -> None:
    """The package's score is the verdict's (mlperf.verdict): the olympic mean of the converged
    runs' times, RCP-normalised. The result summarizer scores every log the compliance checker
    passes (`compliant`: their paths; default every log), which includes a run_stop aborted after an evaluation at
    the target (the RCP checker counts that run as not converged) and leaves out a converged run
    whose log fails a rule (one such log is tolerated); where the two scores differ, the
    verdict's stands and the difference is named (`score_difference`)."""
    from .rcp import check_runs, olympic_score
    try:
        norm = check_runs(runs, ruleset=ruleset).norm_factor
    except (FileNotFoundError, KeyError, ValueError):
        norm = 1.0
    own = olympic_score([r.convergence().minutes for r in runs], norm)
    why = score_difference(res.score_min, own, runs,
                           {r.path for r in runs} if compliant is None else compliant)
    if why:
        res.warnings.append(why)
    res.score_min = own


def score_difference(theirs: float | None, own: float | None, runs: list[RunLog],
                     compliant: set[str]) -> str | None:
    """Why the result summarizer's score (`theirs`) differs from the package's (`own`), in
    words; None when they agree."""
    if theirs is None or (own is not None and abs(own - theirs) <= 1e-3):
        return None
    ours = f"{own:.3f} min" if own is not None else "none (too few converged runs)"
    only_theirs = [f"{r.path}: {r.convergence().words}" for r in runs
                   if r.path in compliant and not r.converged]
    only_ours = [r.path for r in runs if r.converged and r.path not in compliant]
    parts = []
    if only_theirs:
        parts.append(f"counting runs that did not converge ({'; '.join(only_theirs)})")
    if only_ours:
        parts.append(f"leaving out converged runs whose logs fail the compliance checker "
                     f"({', '.join(only_ours)})")
    if parts:
        return (f"the result summarizer scores {theirs:.3f} min, {' and '.join(parts)}; the "
                f"package's score counts the converged runs: {ours}")
    return (f"the result summarizer scores {theirs:.3f} min, the package {ours}, both counting "
            "the same runs: the difference is in the runs' times or the RCP normalisation "
            "(summary.csv, rcp_checker.log)")


def package(logs_dir: str | Path, *, out: str | Path, org: str, cfg=None,
            system_desc: str | Path | None = None, system: str | None = None,
            impl: str = "megatron-core", ruleset: str = RULESET) -> PackageResult:
    """Assemble and check; PackageError when refused before the checkers. Relative paths are
    resolved once, against the working folder (the checkers run with the tree as theirs)."""
    out = Path(out).absolute()
    if cfg is None and system_desc is None:
        raise PackageError("give --config (system data from llama31_405b/systems) or --system-desc")
    runs = read_runs(find_logs(logs_dir))
    bench, warnings = validate_runs(runs, cfg)
    if system_desc is not None:
        sd = Path(system_desc)
        try:
            desc = json.loads(sd.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise PackageError(f"{sd}: cannot read the system description: {e}") from None
        system = system or sd.stem
    else:
        desc = system_description(cfg, org)
        system = system or f"{cfg.derived.system.id}_n{cfg.derived.nodes}"
    try:   # one system per submission: the logs' submission_* events, the config, the description
        warnings += identity.against(runs, cfg, desc, system_desc or "generated from --config and "
                                     "--org", STATUS)
    except identity.SystemMismatch as e:
        raise PackageError(str(e)) from None
    refuse_earlier_package(out=Path(out), org=org, system=system, desc=desc, benchmark=bench)
    comp = [check_log(r.path, ruleset=ruleset) for r in runs]
    bad = [c for c in comp if not c.ok]
    tolerated = 1 if len(runs) > 1 else 0
    if len(bad) > tolerated:
        raise PackageError(f"{len(bad)} of {len(runs)} logs fail the compliance checker "
                           f"(ruleset {ruleset}); the package checker accepts at most {tolerated}:"
                           "\n  " + "\n  ".join(c.verdict() for c in bad))
    warnings += [f"{c.verdict()} (tolerated under olympic scoring)" for c in bad]
    if desc.get("submitter") != org:
        warnings.append(f"system description submitter {desc.get('submitter')!r} != --org {org!r}")
    refuse_other_code(Path(out) / org / "benchmarks" / bench / "implementations" / impl)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    org_dir = assemble(runs, out=out, org=org, system=system, desc=desc, benchmark=bench, impl=impl)
    res = PackageResult(org_dir=org_dir, benchmark=bench, system=system, warnings=warnings, runs=runs)
    res.steps.append(Step("compliance checker", True, "; ".join(
        f"{Path(c.path).name}: {'pass' if c.ok else 'FAIL'} ({len(c.rule_files)} rule files)"
        for c in comp)))
    res_dir = org_dir / "results" / system / bench
    from mlperf_logging.benchmark_meta import get_allowed_benchmarks
    if bench in get_allowed_benchmarks(USAGE, ruleset):
        checks = claim_check_files(out)
        res.notes.append("checkers' logs: " + ", ".join(str(p) for p in checks.values()))
        res.steps.append(run_package_checker(org_dir, ruleset, checks["package"]))
        res.steps.append(run_rcp_checker(res_dir, ruleset, checks["rcp"]))
        step, res.score_min = run_summarizer(org_dir, bench, ruleset, checks["csv"],
                                             desc.get("system_name"))
        res.steps.append(step)
        _agree_on_score(res, runs, ruleset, {c.path for c in comp if c.ok})
    elif bench == "tiny_llama31":
        res.notes.append("package checker and result summarizer not run: tiny_llama31 is not an "
                         "MLPerf benchmark (the package checker would print 'Skipping benchmark'); "
                         "their checks run one by one with the project's rules and RCPs")
        steps, res.score_min = tiny_checks(org_dir, res_dir, runs,
                                           org_dir / "systems" / f"{system}.json", ruleset)
        res.steps += steps
    else:
        res.steps.append(Step("package checker", False, f"{bench} is not a benchmark of ruleset "
                              f"{ruleset}", skipped=True))
    return res
