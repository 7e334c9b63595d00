"""Time-to-target of the tiny benchmark: the project's Megatron-core run vs a plain PyTorch Llama
loop written for the comparison, on the same machine, in the same process.

Both start from the tiny initial checkpoint (the plain model takes Megatron's weights), read the
same samples in the same order (GBS 8 as MiniBS/MBS microbatches), use AdamW with the rules'
hyperparameters, the same LR schedule, gradient clipping 1.0, and evaluate the same 64
validation sequences at the rules' steps until the 5.6 target. The project side is the real run:
train.loop.Run with the MLPerf log and progress hooks of `train`; the plain side runs outside the
project's CPU patches (cpu_compat), as a user's own loop would.

The two run back to back as a pair, `--pairs` times, the order alternating (project first, then
plain first, ...): a shared 2-core VM drifts by tens of percent over minutes, so only runs taken
seconds apart compare. Printed: each run's time and evaluations, each pair's ratio project /
plain (lower is better; 1.0 = no framework overhead), and the median over the pairs; beside it
the same ratio for the training steps alone (per step: the run's time minus its evaluations) and
for one evaluation. `--steps N` times N training steps of each side instead (shorter pairs, so
more of them): the per-step overhead alone; the evaluations the project's run makes before step
N (the plain loop makes none then) are taken out of its time.

`--lockstep` makes each pair one time-to-target run of both sides in lockstep instead: after
each of the project's training steps (its `on_step_end` hook) the plain loop makes one step, and
its evaluation at an evaluation step; each side's clock leaves out the other's work. The VM's
drift then reaches both sides within a second of each other, where the pairs above see it over
minutes: on a 2-core VM, 20-step runs of the two sides one after the other gave per-step
ratios of 1.01-1.27, in lockstep 1.04-1.08 (docs/training.md). The project's loader thread
(reading the next step's 8 samples, ~1.5 ms) may run during the plain step, as it runs beside
the project's own step in the pairs.

Each run is timed twice: wall-clock, the goal's measure, and the CPU time of the process
(`time.process_time`: every thread of the bench, the project's loader thread included). Load
from other processes stretches the wall clock but not the CPU time; a change in the VM's own
speed moves both (on a 2-core VM here both sides ran ~25% faster within 16 minutes, CPU time
with them: see docs/training.md). At `--threads 1` the two measure the same work; with more
threads the CPU time also counts OpenMP workers spinning while they wait.

usage: python bench/tiny_train.py [--config configs/tiny_cpu.toml] [--seed 1] [--pairs 3]
                                  [--steps N | --lockstep] [--threads N]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from plain_llama import PlainLlama  # noqa: E402


# ----------------------------------------------------------------------------------- the two runs
def _now() -> tuple[float, float]:
    """(wall-clock seconds, CPU seconds of this process)."""
    return time.perf_counter(), time.process_time()


def _since(t0: tuple[float, float]) -> tuple[float, float]:
    t1 = _now()
    return t1[0] - t0[0], t1[1] - t0[1]


class _EvalTime:
    """(wall, CPU) seconds spent evaluating, summed over a run's evaluations."""

    def __init__(self):
        self.total, self._t0 = (0.0, 0.0), None

    def start(self):
        self._t0 = _now()

    def stop(self):
        d = _since(self._t0)
        self.total = (self.total[0] + d[0], self.total[1] + d[1])


class _Clock:
    """Hook: the time from run_start to run_stop, or to the end of step `steps` (per-step
    measure: the run is then asked to stop; it does one more, untimed, step), and the part of it
    spent in evaluations (which the per-step measure subtracts: the run evaluates at its
    evaluation steps before step `steps`, the plain loop does not evaluate then)."""

    def __init__(self, steps: int | None):
        from llama31_405b.train.hooks import Hook
        self.steps, self.t0, self.elapsed, self.evals = steps, _now(), None, _EvalTime()
        clock = self

        class _Hook(Hook):
            def on_run_start(self, run):
                clock.t0 = _now()

            def on_step_end(self, run, stats):
                if clock.steps and stats.step == clock.steps and clock.elapsed is None:
                    clock.elapsed = _since(clock.t0)
                    run.request_stop("bench: per-step measure done")

            def on_eval_start(self, run, step):
                if clock.elapsed is None:
                    clock.evals.start()

            def on_eval_end(self, run, step, value, eval_time_s):
                if clock.elapsed is None:
                    clock.evals.stop()

            def on_run_stop(self, run, status, reason):
                if clock.elapsed is None:
                    clock.elapsed = _since(clock.t0)
        self.hook = _Hook()


def run_project(cfg, seed, datasets, steps=None, extra_hooks=()):
    """The real run: train.loop.Run with the hooks `train` uses (MLPerf log to a temporary file,
    progress lines), its stdout/stderr copies going to memory; `extra_hooks` run after them."""
    import io
    import tempfile
    from llama31_405b.train.loop import Run
    from llama31_405b.train.mllog import MLPerfLogHook
    from llama31_405b.train.progress import ProgressHook
    clock = _Clock(steps)
    with tempfile.TemporaryDirectory() as tmp:
        hooks = [MLPerfLogHook(cfg, seed=seed, log_file=f"{tmp}/log.txt", rank=0,
                               echo=io.StringIO()),
                 ProgressHook(cfg, rank=0, stream=io.StringIO()), clock.hook, *extra_hooks]
        run = Run(cfg, seed=seed, hooks=hooks, datasets=datasets)
        status = run.execute()
    n = steps or run.state.step
    return clock.elapsed, n, [(s, v) for s, _, v in run.state.evals], status, clock.evals.total


class PlainRun:
    """The plain loop, one training step or evaluation at a time, outside the project's CPU
    patches (cpu_compat's torch-function mode, which the project's setup leaves active in this
    process): what a PyTorch user's loop pays."""

    def __init__(self, cfg, seed, datasets, init_sd):
        from llama31_405b.model.rope import llama31_inv_freq
        from llama31_405b.train.batches import eval_microbatches
        from llama31_405b.train.schedule import LRSchedule
        self.cfg, self.d, self.train_ds = cfg, cfg.derived, datasets[0]
        with _no_mode():
            torch.manual_seed(seed)
            self.model = PlainLlama(cfg.model, self.d.padded_vocab_size,
                                    llama31_inv_freq(cfg.model))
            self.model.load_megatron(init_sd)
            params = list(self.model.named_parameters())
            self.opt = torch.optim.AdamW(
                [{"params": [p for n, p in params if p.dim() > 1], "wd_mult": 1.0},
                 {"params": [p for n, p in params if p.dim() == 1], "wd_mult": 0.0}],
                lr=self.d.lr, betas=(self.d.adam_beta1, self.d.adam_beta2), eps=self.d.adam_eps)
        self.sched = LRSchedule.from_config(cfg)
        mbs = cfg.batch.micro_batch_size
        self.valid = eval_microbatches(datasets[1], shard=range(self.d.eval_samples),
                                       mbs=cfg.batch.eval_micro_batch_size or mbs)
        self.step, self.evals, self.eval_time = 0, [], _EvalTime()

    def train_step(self):
        from llama31_405b.train.batches import train_microbatches
        d, model, opt = self.d, self.model, self.opt
        with _no_mode():
            opt.zero_grad(set_to_none=True)
            batches = train_microbatches(self.train_ds, step=self.step, gbs=d.gbs,
                                         minibs=self.cfg.batch.minibs,
                                         mbs=self.cfg.batch.micro_batch_size, dp_rank=0)
            ntok = sum(float(b["loss_mask"].sum()) for b in batches)
            for b in batches:
                loss = (model(b["tokens"], b["labels"]) * b["loss_mask"]).sum() / ntok
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), d.clip_grad)
            self.sched.apply(opt, self.step)
            opt.step()
        self.step += 1

    def eval_due(self) -> bool:
        d = self.d
        return (self.step >= d.first_eval_step
                and (self.step - d.first_eval_step) % d.eval_interval_steps == 0)

    def evaluate(self) -> bool:
        """One timed evaluation after this step; True when it reached the target."""
        self.eval_time.start()
        with _no_mode():
            self.model.eval()
            with torch.no_grad():
                tot = sum(float((self.model(b["tokens"], b["labels"]) * b["loss_mask"]).sum())
                          for b in self.valid)
                value = tot / sum(float(b["loss_mask"].sum()) for b in self.valid)
            self.model.train()
        self.eval_time.stop()
        self.evals.append((self.step, value))
        return value <= self.d.target

    def advance(self) -> bool:
        """One training step and, at an evaluation step, its evaluation; True when done (the
        target reached, or max_steps)."""
        self.train_step()
        if self.eval_due() and self.evaluate():
            return True
        return self.step >= self.d.max_steps


def _no_mode():
    """Outside cpu_compat's torch-function mode where it is active (a null context otherwise)."""
    import contextlib
    from torch.overrides import _get_current_function_mode_stack, _pop_mode_temporarily
    return _pop_mode_temporarily() if _get_current_function_mode_stack() else contextlib.nullcontext()


def run_plain(cfg, seed, datasets, init_sd, steps=None):
    """The plain loop alone: to the target, or `steps` training steps without evaluation."""
    plain = PlainRun(cfg, seed, datasets, init_sd)
    t0 = _now()
    if steps:
        while plain.step < steps:
            plain.train_step()
    else:
        while not plain.advance():
            pass
    return _since(t0), plain.step, plain.evals, plain.eval_time.total


def run_lockstep(cfg, seed, datasets, init_sd):
    """Both to the target in one run, in lockstep: after each of the project's training steps
    (its `on_step_end` hook) the plain loop makes its own step, and its evaluation at an
    evaluation step; each side's clock leaves the other's work out. Drift of the machine's speed
    then falls on both sides alike within a second, where the pairs see it over minutes. The
    plain loop finishes alone if the project's run stops first."""
    import gc
    from llama31_405b.train.hooks import Hook
    plain = PlainRun(cfg, seed, datasets, init_sd)
    spent, done = [0.0, 0.0], [False]     # the plain side's (wall, CPU) seconds; its end

    def advance():
        # the plain loop keeps Python's automatic GC, also inside a manual_gc project run
        gc_was_on = gc.isenabled()
        gc.enable()
        t = _now()
        try:
            done[0] = plain.advance()
        finally:
            dt = _since(t)
            if not gc_was_on:
                gc.disable()
        spent[0], spent[1] = spent[0] + dt[0], spent[1] + dt[1]

    class _Lockstep(Hook):
        def on_step_end(self, run, stats):
            if not done[0]:
                advance()

    t, n, evals, status, te = run_project(cfg, seed, datasets, extra_hooks=[_Lockstep()])
    # the plain steps made inside the project's run are not the project's time
    project = ((t[0] - spent[0], t[1] - spent[1]), n, evals, status, te)
    while not done[0]:
        advance()
    return project, (tuple(spent), plain.step, plain.evals, plain.eval_time.total)


def _load_load() -> str:
    try:
        return "load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load average unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs" / "tiny_cpu.toml"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=3,
                    help="back-to-back (project, plain) pairs, the order alternating (default 3)")
    ap.add_argument("--steps", type=int, default=None,
                    help="per-step measure: time N training steps of each side, no evaluation "
                         "(default: time to target)")
    ap.add_argument("--lockstep", action="store_true",
                    help="each pair is one time-to-target run of both sides in lockstep (the "
                         "plain loop steps inside the project's step hook), not two runs")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's); 1 for comparable CPU times")
    args = ap.parse_args()
    if args.lockstep and args.steps:
        print("--lockstep measures the time to target: drop --steps", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    from llama31_405b.config import load_config
    from llama31_405b.data.datasets import build_datasets
    from llama31_405b.data.tiny import ensure_tiny_data
    from llama31_405b.checkpoint.format import is_complete
    from llama31_405b.train.pretrain import init_checkpoint_path
    import os
    os.chdir(REPO)
    cfg = load_config(args.config)
    ensure_tiny_data(cfg.data.data_dir)
    if not is_complete(init_checkpoint_path(cfg)):
        print("no initial checkpoint: run `python -m llama31_405b train-init --config "
              f"{args.config}` (or make demo) first", file=sys.stderr)
        return 2
    d = cfg.derived
    if args.steps is not None and not 0 < args.steps < d.max_steps:
        print(f"--steps must be in 1..{d.max_steps - 1}", file=sys.stderr)
        return 2
    from llama31_405b.parallel.setup import setup_parallel
    setup_parallel(cfg)
    datasets = build_datasets(cfg, seed=args.seed, train_samples=d.max_steps * d.gbs)
    # the initial weights, as Megatron loads them (before training changes them)
    from llama31_405b.model.builder import build_model
    from llama31_405b.checkpoint import format as ckpt_format
    chunks = build_model(cfg)
    ckpt_format.load(chunks, init_checkpoint_path(cfg), cfg)
    init_sd = {k: v.detach().clone() for k, v in chunks[0].state_dict().items()
               if not k.endswith("_extra_state")}
    del chunks
    what = (f"{args.steps} steps, no evaluation" if args.steps else
            "time to target, both sides in lockstep" if args.lockstep else "time to target")
    print(f"threads: {torch.get_num_threads()}; config {args.config}; seed {args.seed}; "
          f"{args.pairs} pairs; measure: {what}; {_load_load()}", flush=True)
    # untimed: the first steps of each side in this process (lazy initialisation in torch,
    # Megatron and the data path) would otherwise weigh on the first pair only
    run_project(cfg, args.seed, datasets, 2)
    run_plain(cfg, args.seed, datasets, init_sd, 2)
    ratios, per_step, cpu_ratios, per_eval = [], [], [], []
    for i in range(args.pairs):
        res = {}
        both = run_lockstep(cfg, args.seed, datasets, init_sd) if args.lockstep else None
        for side in (("project", "plain") if i % 2 == 0 else ("plain", "project")):
            if side == "project":
                t, n, evals, status, te = (both[0] if both else
                                           run_project(cfg, args.seed, datasets, args.steps))
                tail = "" if args.steps else f", status {status}"
            else:
                t, n, evals, te = both[1] if both else run_plain(cfg, args.seed, datasets,
                                                                 init_sd, args.steps)
                tail = ""
            n_evals = len(evals)
            if args.steps:        # the project evaluated before step N, inside the window: out
                t, n_evals = (t[0] - te[0], t[1] - te[1]), 0
                te = (0.0, 0.0)
            res[side] = (t, n, te, n_evals)
            ev = f", evals {[(s, round(v, 4)) for s, v in evals]}" if evals else ""
            print(f"  pair {i + 1} {side:<7}: {t[0]:7.1f} s (CPU {t[1]:7.1f} s), {n} steps"
                  f"{tail}; training {t[0] - te[0]:.1f} s, {n_evals} evaluations {te[0]:.1f} s"
                  f"{ev}", flush=True)
        ((tp, cp), np_, (ep, ecp), kp), ((tq, cq), nq, (eq, ecq), kq) = res["project"], res["plain"]
        ratios.append(tp / tq)
        per_step.append(((tp - ep) / np_) / ((tq - eq) / nq))
        cpu_ratios.append(((cp - ecp) / np_) / ((cq - ecq) / nq))
        order = ("lockstep" if args.lockstep else
                 "project first" if i % 2 == 0 else "plain first")
        line = (f"pair {i + 1} ({order}): ratio "
                f"project/plain {tp / tq:.3f} (training per step {per_step[-1]:.3f}; its CPU time "
                f"{cpu_ratios[-1]:.3f}")
        if kp and kq:
            per_eval.append((ep / kp) / (eq / kq))
            line += f"; per evaluation {per_eval[-1]:.3f}"
        print(f"{line}); {_load_load()}", flush=True)
    import statistics
    med = statistics.median
    kind = "lockstep runs" if args.lockstep else "alternating pairs"
    print(f"median of {len(ratios)} {kind}: ratio project/plain = {med(ratios):.3f} "
          f"(pairs {', '.join(f'{r:.3f}' for r in ratios)}); {_load_load()}")
    print(f"  training per step {med(per_step):.3f} (pairs "
          f"{', '.join(f'{r:.3f}' for r in per_step)}); its CPU time {med(cpu_ratios):.3f} "
          f"(pairs {', '.join(f'{r:.3f}' for r in cpu_ratios)}; threads {torch.get_num_threads()})")
    if per_eval:
        print(f"  per evaluation {med(per_eval):.3f} (pairs "
              f"{', '.join(f'{r:.3f}' for r in per_eval)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
