"""First contact's `profile` check: the project's `profile` machinery (llama31_405b/profile:
capture's ProfileHook, marker, report.analyze_folder) run on the slice's own training run,
after every other check of the slice, so that the trace parsing meets a real trace (on a GPU:
torch.profiler with CUDA activities, the allocator's peaks).

Two fresh profile folders, each a complete `profile` folder (`plan --calibrate` and
`profile --analyze` read it):

- `profile/`: what `profile` does with full-iteration graphs (docs/profile.md, "CUDA graphs"):
  1 replayed step and 1 eager step timed without the profiler, then 2 eager steps profiled
  (Megatron's schedule called directly, as ProfileRun does); on the CPU (no graphs) 1 step
  timed and 2 profiled.
- `profile_replayed/` (CUDA graphs only): 1 step skipped, then 2 replayed steps profiled: what
  a trace of a graph replay holds (kernels without host ops, module roles or launch context).

Both are analysed here (analysis.json, analysis.txt, breakdown.png), and packed into one
gzipped tar file beside the JSON report, named after it: `--report OUT/slice.json` gives
OUT/profile_slice.tgz (`--report OUT/slice.2.json`, a rerun's: OUT/profile_slice.2.tgz, the tag
where scripts/h200_outputs.py puts it); without a report, in the slice's working folder. The
pack is written also when a capture or its analysis failed (the trace then comes back to be
analysed elsewhere). Any failure is this check's, with its reason: the other checks ran before it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict, cast

from .report import Report, Timed

if TYPE_CHECKING:   # torch and the training loop are imported where they are used
    import torch

    from ..profile.capture import ProfileRun
    from ..train.loop import Run
    from ..train.protocols import Microbatch

    ForwardBackward = Callable[[list[Microbatch]], torch.Tensor]
    """Run._forward_backward."""

PACK_PREFIX, PACK_EXT = "profile_", ".tgz"
PACK_LIMIT = 15 * 2**20
"""At most this many bytes packed (the device tool brings back files of up to 16 MiB); above
it the traces are left out of the pack (their analysis stays in)."""
NEEDS_S = 30.0
"""Seconds of the time budget the check needs (a few steps, the trace export, the analysis)."""


class PlanSteps(TypedDict):
    """profile.capture.Plan's step counts."""
    skip: int
    baseline: int
    steps: int


EAGER_PLAN = PlanSteps(skip=0, baseline=1, steps=2)
REPLAYED_PLAN = PlanSteps(skip=1, baseline=0, steps=2)


class Memory(TypedDict):
    """The allocator's peaks in a rank record (profile.capture)."""
    max_allocated_gb: float
    max_reserved_gb: float
    capacity_gb: float


class Figures(TypedDict):
    """One profile folder's figures as its analysis and rank record give them (_figures); the
    ones this module only passes on to the report are `object`."""
    folder: str
    steps_s: list[float]
    measured_step_s: object
    compute_s: float
    host_gap_s: float
    exposed_s: object
    components: object
    unattributed: object
    predicted_step_s: object
    prediction_error: object
    baseline_step_s: list[float]
    eager_step_s: list[float]
    profiled_step_s: object
    overhead_ratio: object
    graphs_speedup: object
    memory: Memory | None
    trace_bytes: object
    gpu_trace: bool
    kernels: int
    cpu_ops: int
    event_categories: dict[str, int]


class _StepDetail(TypedDict):
    step_s: float


class _RankAnalysis(TypedDict):
    """A rank's entry in analysis.json (profile.report), the keys read here."""
    steps_detail: list[_StepDetail]
    compute_s: float
    host_gap_s: float
    exposed_s: object
    components: object
    unattributed: object


class _Analysis(TypedDict):
    """analysis.json (profile.report.analyze_folder), the keys read here."""
    compared_ranks: list[int]
    ranks: dict[str, _RankAnalysis]
    measured_step_s: object
    predicted_step_s: object
    prediction_error: object
    overhead_ratio: object
    graphs_speedup: object


class _RankRecord(TypedDict):
    """A rank record (profile.capture.ProfileHook), the keys read here."""
    trace: str
    baseline_step_s: list[float]
    eager_step_s: list[float]
    profiled_step_s: object
    memory: Memory | None
    trace_bytes: object


class Pack(TypedDict):
    """Where the folders were packed (_pack), or why not (`error`)."""
    path: str
    bytes: NotRequired[int]
    folders: NotRequired[list[str]]
    left_out: NotRequired[list[str]]
    error: NotRequired[str]


def pack_path(report_path: str | Path | None) -> Path | None:
    """Where the pack goes: beside the JSON report, named after it (slice.json ->
    profile_slice.tgz); None without a report."""
    if report_path is None:
        return None
    p = Path(report_path)
    return p.with_name(PACK_PREFIX + p.stem + PACK_EXT)


def profile_check(rep: Report, run: Run) -> None:
    """The `profile` check on `run` (an initialised train.loop.Run whose other checks are
    done). Never raises: a failure is the check's."""
    if not rep.afford(("profile",), NEEDS_S, "the profile"):
        return
    with Timed(rep, "profile"):
        _profile(rep, run)


def _note(rep: Report, **data: object) -> None:
    rep.checks["profile"].data.update(data)
    rep.save()


def _profile(rep: Report, run: Run) -> None:
    from ..profile.capture import GroupThreads, install_annotations
    # `run` gets what ProfileRun adds to the training loop's Run (below): read as one from here
    run = cast("ProfileRun", run)
    gpu, graphs = run.device.gpu, run._graphs is not None
    work = Path(tempfile.mkdtemp(prefix="profile_", dir=run.cfg.checkpoint.ckpt_dir))
    dest = pack_path(rep.path) or work.with_suffix(PACK_EXT)
    folders = [work / "profile"] + ([work / "profile_replayed"] if graphs else [])
    # what ProfileRun adds to the training loop's Run, on this run (ProfileHook reads them)
    run.eager = False
    run.group_threads = GroupThreads()   # the groups exist already: gloo threads unattributed
    saved_fb: ForwardBackward | None = run.__dict__.get("_forward_backward")
    # an instance attribute over the method, on purpose (as ProfileRun overrides it)
    run._forward_backward = _eager_switch(  # type: ignore[method-assign]
        run, run._forward_backward)
    try:
        install_annotations(run)
        eager = _capture(rep, run, folders[0], EAGER_PLAN, graphs=graphs)
        _note(rep, eager=eager)
        if graphs:
            replayed = _capture(rep, run, folders[1], REPLAYED_PLAN, graphs=False)
            _note(rep, replayed=replayed)
        else:
            replayed = None
            _note(rep, replayed="not run: no full-iteration CUDA graphs in this run")
    finally:
        if saved_fb is None:
            del run._forward_backward
        else:
            run._forward_backward = saved_fb  # type: ignore[method-assign]
        run.eager = False
        try:
            pack = _pack([f for f in folders if f.is_dir()], dest)
        except (OSError, tarfile.TarError) as e:   # the figures stand without the pack
            pack = {"path": str(dest), "error": f"{type(e).__name__}: {e}"}
        _note(rep, pack=pack)
    problems = _problems(eager, gpu) + (_problems(replayed, gpu, kernels_needed=False)
                                        if replayed else [])
    if "error" in pack:
        problems.append(f"not packed: {pack['error']}")
    detail = _line(eager, replayed, pack, gpu)
    if problems:
        rep.failed("profile", "; ".join(problems) + f" ({detail})")
    else:
        rep.passed("profile", detail)


def _eager_switch(run: ProfileRun, inner: ForwardBackward) -> ForwardBackward:
    """Run._forward_backward that runs Megatron's schedule itself (no graph replay) while
    `run.eager` is set, as profile.capture.ProfileRun._forward_backward does."""
    def forward_backward(microbatches: list[Microbatch]) -> torch.Tensor:
        if not (run.eager and run._graphs is not None):
            return inner(microbatches)
        from ..train.step import run_schedule
        cfg = run.cfg
        return run_schedule(run.model, microbatches, seq_length=cfg.model.seq_length,
                            mbs=cfg.batch.micro_batch_size, forward_only=False,
                            cp=cfg.parallel.cp, gpu=run.device.gpu, forward_backward=None)
    return forward_backward


def _capture(rep: Report, run: ProfileRun, out: Path, plan_kw: PlanSteps, *,
             graphs: bool) -> Figures:
    """ProfileHook's phases on `run`'s next steps into the fresh folder `out`, then its
    analysis; returns the figures (profile_check's data)."""
    from ..profile.capture import Plan, ProfileHook
    from ..profile.marker import MANIFEST, mark_folder
    from ..profile.report import analyze_folder
    from ..train.prefetch import Prefetcher
    plan = Plan(out=out, **plan_kw)
    mark_folder(out, run.cfg, plan)          # `out` is new: mark_folder clears nothing of ours
    manifest: dict[str, object] = json.loads((out / MANIFEST).read_text())
    manifest["first_contact"] = ("eager steps profiled (Megatron's schedule), replayed and eager "
                                 "steps timed before them" if graphs else
                                 "replayed steps profiled (the full-iteration graph)"
                                 if run._graphs is not None else "steps profiled (no graphs)")
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    n = plan.skip + plan.baseline * (2 if graphs else 1) + plan.steps
    k0 = run.state.step
    if run._loader is not None:     # the loop's loader stops at max_steps: one for these steps
        run._loader.close()
    run._loader = Prefetcher(run._read_train_batch, start=k0, stop=k0 + n)
    hook = ProfileHook(plan, rank=run.info.dist_env.rank, graphs=graphs)
    run.eager = False
    rep.progress(f"profile into {out.name}: {n} steps")
    try:
        hook.on_run_start(run)
        for _ in range(n):
            stats = run.train_step()
            hook.on_step_end(run, dataclasses.replace(stats, step=stats.step - k0))
    finally:
        if hook.rf is not None:
            hook.rf.__exit__(None, None, None)
        if hook.prof is not None and not hook.done:
            try:                       # a failed step: the profiler must not stay on
                hook.prof.stop()
            except Exception:  # noqa: BLE001 - the step's own error is the check's reason
                pass
        run.eager = False
    if not hook.done:
        raise RuntimeError(f"{out.name}: the profiled steps did not complete")
    analyze_folder(out, cfg=run.cfg, workers=1)
    return _figures(out)


def _figures(out: Path) -> Figures:
    """What the folder's analysis.json and rank record say, as read back from the files."""
    from ..profile.trace import load
    # JSON (Any), read through typed views of the keys used (_Analysis, _RankRecord)
    res: _Analysis = json.loads((out / "analysis.json").read_text())
    rank = str(res["compared_ranks"][0])
    m = res["ranks"][rank]
    rec: _RankRecord = json.loads((out / "ranks" / f"rank{int(rank):05d}.json").read_text())
    trace = load(out / rec["trace"])
    cats: dict[str, int] = {}
    for e in trace.events:
        cats[e.cat] = cats.get(e.cat, 0) + 1
    return {"folder": out.name, "steps_s": [s["step_s"] for s in m["steps_detail"]],
            "measured_step_s": res["measured_step_s"], "compute_s": m["compute_s"],
            "host_gap_s": m["host_gap_s"], "exposed_s": m["exposed_s"],
            "components": m["components"], "unattributed": m["unattributed"],
            "predicted_step_s": res["predicted_step_s"],
            "prediction_error": res["prediction_error"],
            "baseline_step_s": rec["baseline_step_s"], "eager_step_s": rec["eager_step_s"],
            "profiled_step_s": rec["profiled_step_s"], "overhead_ratio": res["overhead_ratio"],
            "graphs_speedup": res["graphs_speedup"], "memory": rec["memory"],
            "trace_bytes": rec["trace_bytes"], "gpu_trace": trace.gpu,
            "kernels": cats.get("kernel", 0), "cpu_ops": cats.get("cpu_op", 0),
            "event_categories": cats}


def _problems(fig: Figures, gpu: bool, *, kernels_needed: bool = True) -> list[str]:
    out = []
    what = fig["folder"]
    if not fig["steps_s"]:
        out.append(f"{what}: the analysis found no profiled step in the trace")
    if gpu and kernels_needed and not fig["gpu_trace"]:
        out.append(f"{what}: no CUDA kernel in the trace (CUDA activities not recorded), so "
                   "the GPU trace parsing did not run")
    if gpu and not fig["memory"]:
        out.append(f"{what}: no allocator peaks (torch.cuda.max_memory_allocated/reserved) "
                   "in the rank record")
    return out


def _line(eager: Figures, replayed: Figures | None, pack: Pack, gpu: bool) -> str:
    def ms(xs: list[float]) -> str:
        return "/".join(f"{x * 1e3:.1f}" for x in xs) or "-"

    parts = [f"eager: {len(eager['steps_s'])} profiled steps, {ms(eager['steps_s'])} ms in the "
             f"trace (compute {eager['compute_s'] * 1e3:.1f}, host gaps "
             f"{eager['host_gap_s'] * 1e3:.1f} ms/step; {eager['kernels']} kernels, "
             f"{eager['cpu_ops']} host ops)"]
    if eager["eager_step_s"]:
        parts.append(f"unprofiled: replayed {ms(eager['baseline_step_s'])} ms, eager "
                     f"{ms(eager['eager_step_s'])} ms")
    else:
        parts.append(f"unprofiled: {ms(eager['baseline_step_s'])} ms")
    if replayed:
        parts.append(f"replayed: {len(replayed['steps_s'])} profiled steps, "
                     f"{ms(replayed['steps_s'])} ms ({replayed['kernels']} kernels, "
                     f"{replayed['cpu_ops']} host ops)")
    mem = eager["memory"]
    parts.append(f"peak allocated {mem['max_allocated_gb']:.1f} GB, reserved "
                 f"{mem['max_reserved_gb']:.1f} GB of {mem['capacity_gb']:.0f}" if mem else
                 "memory: none on the CPU (no allocator record)" if not gpu else "memory: none")
    if "error" not in pack:
        parts.append(f"packed: {pack['path']} ({pack['bytes'] / 2**20:.2f} MiB"
                     + (f"; left out: {', '.join(pack['left_out'])}" if pack["left_out"] else "")
                     + ")")
    return "; ".join(parts)


def _pack(folders: list[Path], dest: Path) -> Pack:
    """The folders into one .tar.gz (written whole, then renamed); the traces are left out
    when the whole would pass PACK_LIMIT."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    left_out: list[str] = []

    def write(skip_traces: bool) -> None:
        def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
            if skip_traces and info.name.endswith(".trace.json.gz"):
                left_out.append(info.name)
                return None
            return info
        with tarfile.open(tmp, "w:gz") as tar:
            for f in folders:
                tar.add(f, arcname=f.name, filter=keep)
    write(False)
    if tmp.stat().st_size > PACK_LIMIT:
        write(True)
    os.replace(tmp, dest)
    size = dest.stat().st_size
    print(f"[profile] packed {', '.join(f.name for f in folders)} into {dest} "
          f"({size / 2**20:.2f} MiB)", file=sys.stderr, flush=True)
    return {"path": str(dest), "bytes": size, "folders": [f.name for f in folders],
            "left_out": left_out}
