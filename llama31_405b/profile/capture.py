"""The run driver of `profile`: what `train` runs up to the end of the warm-up (init, checkpoint,
warm-up, restore), then `skip` steps, `baseline` steps timed without the profiler, and `steps`
steps under torch.profiler on the chosen ranks. No MLPerf log: no run_start, no evaluation.

Each rank writes ranks/rank<R>.json (its coordinates, host, device, step times, the allocator's
peaks: with full-iteration graphs those read after the replayed steps, a graphed run's); a profiled
rank also writes traces/rank<R>.trace.json.gz and traces/rank<R>.meta.json (the training
thread, which OS threads each process group's creation started: gloo's worker threads carry no
group in the trace, see attribution.py).
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ..planner.calibrate.read_profile import REPLAYED as MEMORY_AT
from ..train.hooks import Hook
from ..train.loop import Run
from . import attribution as at
from .marker import mark_folder

if TYPE_CHECKING:
    from torch.autograd.profiler import record_function
    from torch.profiler import profile


def _tasks() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:   # not Linux: no thread map (comm events then read "unattributed")
        return set()


class GroupThreads:
    """Records the OS threads that creating each process group starts (gloo: its worker threads
    and its transport loop). Installed around torch.distributed.init_process_group and
    new_group (megatron-core 0.19.2 parallel_state.create_group calls
    torch.distributed.new_group with group_desc) for the duration of the run's init."""

    def __init__(self):
        self.groups: list[dict] = []
        self._saved = None

    def install(self):
        import torch.distributed as dist
        self._saved = (dist.init_process_group, dist.new_group)
        init_pg, new_group = self._saved

        def init_wrapper(*args, **kwargs):
            before = _tasks()
            out = init_pg(*args, **kwargs)
            self._add("default_pg", list(range(dist.get_world_size())), _tasks() - before)
            return out

        def new_group_wrapper(*args, **kwargs):
            before = _tasks()
            group = new_group(*args, **kwargs)
            ranks = kwargs.get("ranks", args[0] if args else None)
            if ranks is None:
                ranks = list(range(dist.get_world_size()))
            if dist.get_rank() in ranks:
                self._add(kwargs.get("group_desc") or "unnamed", sorted(ranks), _tasks() - before)
            return group
        dist.init_process_group, dist.new_group = init_wrapper, new_group_wrapper
        return self

    def uninstall(self):
        if self._saved:
            import torch.distributed as dist
            dist.init_process_group, dist.new_group = self._saved
            self._saved = None

    def _add(self, desc, ranks, tids):
        self.groups.append(dict(desc=desc, role=at.group_role(desc), ranks=list(ranks),
                                tids=sorted(tids)))


def install_annotations(run) -> None:
    """`role:<name>` ranges around the modules of each role (forward hooks), `profile:loss`
    around the loss, `profile:optimizer` around the optimizer step."""
    annotate_modules(run.model)
    run.optimizer.step = _annotated(run.optimizer.step, at.OPTIMIZER_ANNOTATION)


def annotate_modules(chunks) -> None:
    """The role annotations on megatron modules (a GPTModel's chunks, or any module tree whose
    names end like megatron's: `self_attention.linear_qkv`, `mlp.linear_fc1`, ...; Transformer
    Engine layers of megatron's TE spec keep those names). Also usable outside a profile run,
    e.g. around one layer's forward/backward, with `analysis.compute_split` on its trace."""
    from torch.autograd.profiler import record_function
    for chunk in chunks:
        for name, mod in chunk.named_modules():
            role = at.module_role(name)
            if role is not None:
                stack: list = []

                def pre(_m, _a, _role=role, _stack=stack):
                    rf = record_function(at.ROLE_PREFIX + _role)
                    rf.__enter__()
                    _stack.append(rf)

                def post(_m, _a, _o, _stack=stack):
                    if _stack:
                        _stack.pop().__exit__(None, None, None)
                mod.register_forward_pre_hook(pre)
                mod.register_forward_hook(post)
            loss_fn = getattr(mod, "compute_language_model_loss", None)
            if callable(loss_fn) and not getattr(loss_fn, "_profile_wrapped", False):
                mod.compute_language_model_loss = _annotated(loss_fn, at.LOSS_ANNOTATION)


def _annotated(fn, label):
    from torch.autograd.profiler import record_function

    def wrapper(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)
    setattr(wrapper, "_profile_wrapped", True)  # a function attribute: read back by getattr above
    return wrapper


class ProfileRun(Run):
    """The training run without evaluations, with the thread map and the annotations. With
    full-iteration CUDA graphs, `eager` makes a step run Megatron's schedule itself instead of
    the graph's replay (a replay leaves kernels without any host op, role or process group in
    the trace: docs/profile.md, "CUDA graphs")."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.group_threads = GroupThreads()
        self.eager = False

    def _forward_backward(self, microbatches):
        if not (self.eager and self._graphs):
            return super()._forward_backward(microbatches)
        from ..train.step import run_schedule
        cfg = self.cfg
        return run_schedule(self.model, microbatches, seq_length=cfg.model.seq_length,
                            mbs=cfg.batch.micro_batch_size, forward_only=False,
                            cp=cfg.parallel.cp, gpu=self.device.gpu, forward_backward=None)

    def _init(self):
        self.group_threads.install()
        try:
            super()._init()
        finally:
            self.group_threads.uninstall()
        install_annotations(self)

    def is_eval_step(self, step: int) -> bool:
        return False


@dataclasses.dataclass
class Plan:
    out: Path
    skip: int = 2
    baseline: int = 3
    steps: int = 3
    ranks: list | None = None
    """Global ranks to profile; None: every rank of DP replica 0, plus the first rank (TP, CP
    and PP rank 0) of every other replica."""


class ProfileHook(Hook):
    """Phases after the warm-up: skip, baseline (timed), [eager baseline (timed; full-iteration
    graphs only)], profiled."""

    def __init__(self, plan: Plan, *, rank: int, graphs: bool = False, stream: TextIO | None = None):
        # the stream of now, not the one of the module's import (a default argument is evaluated
        # once: a later replaced sys.stderr, e.g. pytest's capture per test, would be written
        # after it was closed)
        self.plan, self.rank = plan, rank
        self.stream = stream if stream is not None else sys.stderr
        self.graphs = graphs
        self.t_prev = time.perf_counter()
        self.baseline_s: list[float] = []
        self.eager_s: list[float] = []
        self.profiled_s: list[float] = []
        self.prof: profile | None = None
        self.rf: record_function | None = None
        self.done = False
        self.profiled = False
        self.replayed_memory: dict | None = None
        """Full-iteration graphs: the allocator's peaks after the replayed steps (`_to_eager`)."""
        self.probe: dict | None = None
        """Rank 0 of a CPU run: the precision probe (profile/probe.py)."""
        self.stop_reason = ""
        """Why the run ended (the run's own reason, `Run.execute`): what `profile` prints when
        the profiled steps were not all written."""

    def on_run_stop(self, run, status, reason):
        self.stop_reason = f"{status}: {reason}" if reason else status

    def _say(self, msg):
        if self.rank == 0:
            print(f"[profile] {msg}", file=self.stream, flush=True)

    def on_run_start(self, run):
        info = run.info
        p = self.plan
        self.profiled = (self.rank in p.ranks if p.ranks is not None else
                         info.dp_rank == 0 or (info.tp_rank == 0 and info.pp_rank == 0
                                               and info.cp_rank == 0))
        self.parallel_groups = _parallel_groups()
        if self.rank == 0 and not run.device.gpu:  # the others wait at the barrier below
            from .probe import run_probe
            self.probe = run_probe(run.cfg)
        # every rank leaves here together: no rank's first timed step holds rank 0's probe
        import torch.distributed as dist
        dist.barrier()
        self._say(f"warm-up done; {p.skip} step(s) skipped, {p.baseline} timed without the "
                  f"profiler, {p.steps} profiled")
        if p.skip == 0 and p.baseline == 0:
            if self.graphs:
                self._to_eager(run)
            self._start(run)
        self.t_prev = time.perf_counter()

    def _start(self, run):
        if not self.profiled:
            return
        from torch.autograd.profiler import record_function
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU]
        if run.device.gpu:
            acts.append(ProfilerActivity.CUDA)
        prof = profile(activities=acts, record_shapes=False)
        prof.start()
        rf = record_function(f"profile_step#{len(self.profiled_s)}")
        rf.__enter__()
        self.prof, self.rf = prof, rf
        self.main_tid = _gettid()

    def on_step_end(self, run, stats):
        # a step's time runs from the end of the previous call of this hook (after the profiler
        # started and the step's annotation opened) to here, before anything else: the same
        # window the trace holds (starting the profiler took tens of ms under load)
        now = time.perf_counter()
        dt = now - self.t_prev
        p = self.plan
        k = stats.step
        eager_steps = p.baseline if self.graphs else 0
        timed = p.skip + p.baseline + eager_steps   # steps before the profiled ones
        last = timed + p.steps
        if k > timed and self.rf is not None:
            self.rf.__exit__(None, None, None)
            self.rf = None
        phase = ("skipped" if k <= p.skip else "timed, no profiler" if k <= p.skip + p.baseline
                 else "timed eager, no profiler" if k <= timed
                 else "profiled" if self.profiled or self.rank != 0 else "profiled elsewhere")
        self._say(f"step {k}/{last} ({phase}): {dt * 1e3:.1f} ms, loss {stats.loss:.4f}")
        if k <= p.skip:
            pass
        elif k <= p.skip + p.baseline:
            self.baseline_s.append(dt)
        elif k <= timed:
            self.eager_s.append(dt)
        else:
            self.profiled_s.append(dt)
        if self.graphs and k == p.skip + p.baseline:
            self._to_eager(run)  # from the next step on: Megatron's schedule, not the replay
        if k == timed and p.steps:
            self._start(run)
        elif k > timed and self.prof is not None:
            from torch.autograd.profiler import record_function
            if k < last:
                rf = record_function(f"profile_step#{len(self.profiled_s)}")
                rf.__enter__()
                self.rf = rf
            else:
                self.prof.stop()
        if k == last:
            self.done = True
            self._write(run)
        self.t_prev = time.perf_counter()

    def _to_eager(self, run):
        """Switch to eager steps. First the allocator's peaks of the run so far (its warm-up, the
        graph's capture, the replayed steps): a graphed run's, kept as the rank's `memory`. Then
        the peaks are reset: the eager steps allocate their activations outside the captured
        graph's pool, which stays held, and peak higher than a graphed run ever does (their own
        peaks are `memory_eager`, for the record)."""
        self.replayed_memory = _memory(run)
        _reset_peaks(run)
        run.eager = True

    def _write(self, run):
        info = run.info
        out = self.plan.out
        rank = self.rank
        trace_path = out / "traces" / f"rank{rank:05d}.trace.json.gz"
        if self.prof is not None:
            trace_path.parent.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            self.prof.export_chrome_trace(str(trace_path))
            export_s = time.perf_counter() - t0
            meta = dict(rank=rank, main_tid=self.main_tid, groups=run.group_threads.groups,
                        parallel_groups=self.parallel_groups, export_s=export_s)
            _write_json(out / "traces" / f"rank{rank:05d}.meta.json", meta)
        base = self.eager_s or self.baseline_s
        rec = dict(rank=rank, host=socket.gethostname(), device=_device_name(run),
                   tp_rank=info.tp_rank, pp_rank=info.pp_rank, cp_rank=info.cp_rank,
                   dp_rank=info.dp_rank, profiled=self.prof is not None,
                   baseline_step_s=self.baseline_s, profiled_step_s=self.profiled_s,
                   eager_step_s=self.eager_s, cuda_graphs=self.graphs,
                   overhead_ratio=(_mean(self.profiled_s) / _mean(base)
                                   if base and self.profiled_s else None),
                   graphs_speedup=(_mean(self.eager_s) / _mean(self.baseline_s)
                                   if self.eager_s and self.baseline_s else None),
                   memory=self.replayed_memory if self.graphs else _memory(run),
                   memory_at=MEMORY_AT if self.graphs else "after the profiled steps",
                   memory_eager=_memory(run) if self.graphs else None,
                   precision_probe=self.probe,
                   trace=str(trace_path.relative_to(out)) if self.prof is not None else None,
                   trace_bytes=trace_path.stat().st_size if self.prof is not None else None)
        _write_json(out / "ranks" / f"rank{rank:05d}.json", rec)
        self._say(f"traces written to {out}/traces")


def _parallel_groups() -> dict:
    """This rank's TP, CP, PP and DP (with CP) groups as megatron's parallel_state has them: the
    reference the attribution is checked against (tests)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    groups = dict(TP=ps.get_tensor_model_parallel_group(), CP=ps.get_context_parallel_group(),
                  PP=ps.get_pipeline_model_parallel_group(),
                  DP=ps.get_data_parallel_group(with_context_parallel=True))
    return {k: dist.get_process_group_ranks(g) for k, g in groups.items()}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _gettid() -> int:
    """The OS thread id (Linux: gettid), as the trace's tid."""
    return threading.get_native_id()


def _memory(run) -> dict | None:
    """This rank's device memory peaks since the start or the last `_reset_peaks`, from
    PyTorch's caching allocator (torch.cuda.max_memory_allocated, max_memory_reserved): what
    `plan --calibrate` fits the memory model's constants to (the run's whole, or with
    full-iteration graphs up to the last replayed step: `ProfileHook._to_eager`). None on CPU:
    there is no allocator record of the host's memory to compare the model with."""
    if not run.device.gpu:
        return None
    import torch
    gb = 1e9
    return {"max_allocated_gb": torch.cuda.max_memory_allocated() / gb,
            "max_reserved_gb": torch.cuda.max_memory_reserved() / gb,
            "capacity_gb": torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / gb}


def _reset_peaks(run) -> None:
    """Reset the allocator's peaks to what it holds now (torch.cuda.reset_peak_memory_stats);
    nothing on CPU."""
    if run.device.gpu:
        import torch
        torch.cuda.reset_peak_memory_stats()


def _device_name(run) -> str:
    if run.device.gpu:
        import torch
        i = torch.cuda.current_device()
        return f"cuda:{i} {torch.cuda.get_device_name(i)}"
    return "cpu"


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def full_iteration_graphs(cfg) -> bool:
    return cfg.derived.system.is_gpu and cfg.performance.cuda_graphs == "full_iteration"


def profile_config(cfg, plan: Plan):
    """The config of a profile run: max steps = skip + baseline (twice with full-iteration
    graphs: replayed, then eager) + steps, no evaluation; per-layer graphs ("layers") off: their
    replays bypass the modules the roles are read from."""
    eager = plan.baseline if full_iteration_graphs(cfg) else 0
    run = dataclasses.replace(cfg.run, max_steps=plan.skip + plan.baseline + eager + plan.steps)
    out = dataclasses.replace(cfg, run=run)
    if cfg.performance.cuda_graphs == "layers":
        out = dataclasses.replace(out, performance=dataclasses.replace(cfg.performance,
                                                                       cuda_graphs="none"))
    return out


def run_profile(cfg, plan: Plan, *, seed: int, dist_env, timeout_s: float = 600.0,
                init_checkpoint: str | None = None) -> ProfileHook:
    """Run the steps on this rank and write its files; returns the hook (done: all written)."""
    if dist_env.rank == 0:
        mark_folder(plan.out, cfg, plan)
    hook = ProfileHook(plan, rank=dist_env.rank, graphs=full_iteration_graphs(cfg))
    pcfg = profile_config(cfg, plan)
    run = ProfileRun(pcfg, seed=seed, hooks=[hook],
                     dist_env=dist_env, timeout_s=timeout_s, init_checkpoint=init_checkpoint)
    run.execute()
    return hook
