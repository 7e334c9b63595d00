"""The rehearsal of one config: every chosen rank in a process of its own (rehearse/rank.py; a
fork of a server that imported torch and megatron-core once, rehearse/forks.py), the dataset
index in one more (rehearse/dataset.py), the MLPerf header and the compliance precheck
here, the planner's prediction beside each rank, then the verdict (rehearse/report.py).

Child processes see no CUDA (CUDA_VISIBLE_DEVICES=""), one OpenMP thread, and import the same
checkout as this process (PYTHONPATH). At most `jobs` of them run at once.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MAX_INDEX_GB = 10.0
"""Default bound on the training index (rank 0 builds it in host memory before init_stop, every
rank maps it): the shipped configs need about 0.5 GB; the whole LR schedule (1.2 M steps at
GBS 1152) would need well over 100 GB and hours."""


@dataclass
class Options:
    ranks: list[int] | None = None
    jobs: int = 2
    max_index_gb: float = DEFAULT_MAX_INDEX_GB
    allocation: str | None = None
    sets: list[str] = field(default_factory=list)
    timeout_s: float = 900.0
    keep_dir: str | None = None
    """Write the children's JSON and logs there (default: a temporary directory)."""
    dataset: bool = True
    """False: skip the dataset index (the per-config planner check of the tests)."""


@dataclass
class _Job:
    name: str
    module: str
    """Run as `module.main(args)`: a fork of the preloaded server (rehearse/forks.py), else
    `python -m module args`."""
    args: list[str]
    out: Path
    log: Path
    started: float = 0.0
    result: dict | None = None


class _Process(Protocol):
    """What run_jobs needs of a job's process: a subprocess.Popen, or a _Fork."""

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...

    def wait(self) -> object: ...

    @property
    def returncode(self) -> int | None: ...


class _Fork:
    """A fork (multiprocessing.Process) behind subprocess.Popen's poll/kill/wait/returncode."""

    def __init__(self, p):
        self.p = p

    def poll(self):
        return None if self.p.is_alive() else self.p.exitcode

    def kill(self):
        self.p.kill()

    def wait(self):
        self.p.join()

    @property
    def returncode(self):
        return self.p.exitcode


def _env() -> dict:
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                     else "")
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def _collect(job: _Job, proc: _Process, timed_out: bool) -> dict:
    if job.out.is_file():
        try:
            return json.loads(job.out.read_text())
        except ValueError:
            pass
    tail = job.log.read_text(errors="replace")[-2000:] if job.log.is_file() else ""
    why = "timed out" if timed_out else f"exited {proc.returncode} without a result"
    return {"ok": False, "error": f"{job.name}: {why}", "log_tail": tail}


def run_jobs(jobs: list[_Job], parallel: int, timeout_s: float) -> None:
    """Run the jobs, `parallel` at a time; each gets its result dict (or a failure)."""
    from .forks import Forks
    waiting = list(jobs)
    running: list[tuple[_Job, _Process]] = []
    env = _env()
    forks = Forks(env) if jobs else None
    while waiting or running:
        while waiting and len(running) < max(1, parallel):
            job = waiting.pop(0)
            fork = forks.start(job.module, job.args, str(job.log)) if forks else None
            proc: _Process
            if fork is not None:
                proc = _Fork(fork)
            else:
                with open(job.log, "w") as log:
                    proc = subprocess.Popen([sys.executable, "-m", job.module, *job.args],
                                            cwd=os.getcwd(), env=env, stdout=log,
                                            stderr=subprocess.STDOUT)
            job.started = time.monotonic()
            running.append((job, proc))
        time.sleep(0.2)
        for job, proc in list(running):
            late = time.monotonic() - job.started > timeout_s
            if proc.poll() is None and not late:
                continue
            if late and proc.poll() is None:
                proc.kill()
                proc.wait()
            job.result = _collect(job, proc, late)
            running.remove((job, proc))


def _placement(cfg, alloc) -> dict:
    """The placement check's verdict on the allocation, once, before any rank process starts
    (each rank process repeats it in its own flow, as every rank of the job does)."""
    from ..parallel.placement import PlacementError
    from . import allocation
    try:
        found, logged = allocation.check(cfg, alloc)
    except PlacementError as e:
        return {"ok": False, "error": str(e)}
    return {"ok": True, "racks": len({p.rack for p in found}), "log": logged}


def rehearse(config: str, opts: Options) -> dict:
    """The full report (see report.py). Raises ConfigError (bad config), ValueError (bad
    --ranks) or AllocationError (bad --allocation) before any process starts."""
    from ..config.overrides import load_with_sets
    from ..mlperf.header import header_events
    from ..submission.precheck import precheck_config
    from . import allocation, planner_view, report
    from .rank import run_seed
    from .ranks import coords_of, default_ranks

    cfg = load_with_sets(config, opts.sets)
    alloc = (allocation.read_allocation(opts.allocation) if opts.allocation
             else allocation.synthetic(cfg))
    ranks = opts.ranks if opts.ranks is not None else default_ranks(cfg)
    start = time.monotonic()
    placement = _placement(cfg, alloc)
    if not placement["ok"]:
        ranks = []     # every rank would stop at the same verdict: start none of them
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if opts.keep_dir:
        work = Path(opts.keep_dir)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="rehearse-")
        work = Path(tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    common = [config] + [a for s in opts.sets for a in ("--set", s)]
    data_job = _Job("dataset", "llama31_405b.rehearse.dataset",
                    [*common, "--out", str(work / "dataset.json"), "--max-index-gb",
                     str(opts.max_index_gb)], work / "dataset.json", work / "dataset.log")
    rank_jobs = []
    for r in ranks:
        args = [*common, "--rank", str(r), "--out", str(work / f"rank{r}.json")]
        if opts.allocation:
            args += ["--allocation", opts.allocation]
        rank_jobs.append(_Job(f"rank {r}", "llama31_405b.rehearse.rank", args,
                              work / f"rank{r}.json", work / f"rank{r}.log"))
    header = [{"key": e.key, "value": e.value} for e in header_events(cfg, seed=run_seed(cfg))]
    pre: list = []
    checker = threading.Thread(target=lambda: pre.append(precheck_config(cfg)), daemon=True)
    checker.start()    # the compliance checker runs here while the children work
    try:
        run_jobs(([data_job] if opts.dataset else []) + rank_jobs, opts.jobs, opts.timeout_s)
        checker.join()
    finally:
        if tmp is not None:
            tmp.cleanup()
    rank_results = []
    for r, job in zip(ranks, rank_jobs):
        res = dict(job.result or {})
        res.setdefault("rank", r)
        res.setdefault("coords", {k: v for k, v in coords_of(cfg, r).items() if k != "ep"})
        res["planner"] = planner_view.predict(cfg, res["coords"]["pp"]).as_dict()
        rank_results.append(res)
    d, p = cfg.derived, cfg.parallel
    out = {"config": config, "world_size": d.world_size, "nodes": d.nodes,
           "layout": f"TP{p.tp} PP{p.pp} VP{p.vp} CP{p.cp} DP{d.dp}",
           "allocation": alloc.describe(), "placement": placement,
           "capacity_bytes": d.system.hbm_gb * 1e9, "gpu_system": d.system.is_gpu,
           "max_index_bytes": opts.max_index_gb * 1e9, "steps": d.max_steps, "gbs": d.gbs,
           "dataset": data_job.result if opts.dataset else {"ok": True, "skipped": True},
           "header": header,
           "precheck": ({"ok": pre[0].ok, "errors": pre[0].errors, "notes": pre[0].notes} if pre
                        else {"ok": False, "errors": ["the precheck raised (see stderr)"],
                              "notes": []}),
           "ranks": rank_results, "wall_s": round(time.monotonic() - start, 1)}
    out["checkpoint_read"] = checkpoint_totals(cfg, rank_results)
    out["checkpoint_read_tp_chunks"] = checkpoint_totals(cfg, rank_results, "_tp_chunks")
    out.update(report.verdict(out))
    return out


def checkpoint_totals(cfg, rank_results: list[dict], which: str = "") -> dict | None:
    """The whole job's initial-checkpoint reads (checkpoint/read_plan.py totals), from the reads
    of the played ranks (`which`: "" whole layers, "_tp_chunks" the config's TP chunks); None
    unless every pipeline stage was played."""
    from ..checkpoint.read_plan import totals
    key = "checkpoint_read" + which
    stages = {r["coords"]["pp"]: r[key] for r in rank_results if r.get("ok") and r.get(key)}
    return totals(stages, world=cfg.derived.world_size, tp=cfg.parallel.tp, pp=cfg.parallel.pp)
