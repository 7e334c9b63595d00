"""One tiny run (single process) under observation, for the warm-up, GC and data-access tests.

usage: python tests/helpers/run_probe.py CONFIG OVERRIDES_JSON OUT_JSON

Writes: losses, evaluations, a digest of the final weights, and what happened before run_start:
optimizer steps, forward-only (evaluation) passes, dataset samples read, `.bin` files opened or
memory-mapped (sys.addaudithook: "open", "mmap.__new__"; phase "datasets" while
Run._build_datasets runs), the addresses of parameters / master weights / optimizer state after
the last pre-run_start optimizer step and at run_start; and every gc.collect() with the phase and
step, plus whether automatic GC was on at each step and evaluation.
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import sys

PHASE = {"now": "init", "step": 0}
EVENTS = {"bin": [], "gc": [], "gc_enabled": [], "reads": {"init": 0, "datasets": 0, "run": 0}}


def _audit(event, args):
    if event == "open":
        path = args[0]
    elif event == "mmap.__new__":
        fd = args[0]
        try:
            path = os.readlink(f"/proc/self/fd/{fd}") if isinstance(fd, int) and fd >= 0 else ""
        except OSError:
            path = ""
    else:
        return
    if isinstance(path, (str, bytes)) and os.fsdecode(path).endswith(".bin"):
        EVENTS["bin"].append([PHASE["now"], event, os.fsdecode(path)])


class _Counting:
    """Counts item reads of a dataset, by phase."""

    def __init__(self, ds):
        self._ds = ds

    def __len__(self):
        return len(self._ds)

    def __getitem__(self, i):
        EVENTS["reads"][PHASE["now"]] += 1
        return self._ds[i]

    def __getattr__(self, name):
        return getattr(self._ds, name)


def torch_optimizers(optimizer) -> list:
    chained = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return [getattr(o, "optimizer", o) for o in chained]


def _pointers(run) -> dict:
    out = {}
    for c, chunk in enumerate(run.model):
        for n, p in chunk.named_parameters():
            out[f"model{c}.{n}"] = p.data_ptr()
    for o, opt in enumerate(torch_optimizers(run.optimizer)):
        flat = [p for g in opt.param_groups for p in g["params"]]
        for i, p in enumerate(flat):
            out[f"opt{o}.main{i}"] = p.data_ptr()
            for k, v in opt.state.get(p, {}).items():
                if hasattr(v, "data_ptr"):
                    out[f"opt{o}.state{i}.{k}"] = v.data_ptr()
    return out


def main() -> int:
    cfg_path, overrides, out_path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    sys.addaudithook(_audit)
    real_collect = gc.collect

    def collect(*a, **k):
        EVENTS["gc"].append([PHASE["now"], PHASE["step"]])
        return real_collect(*a, **k)
    gc.collect = collect

    import torch
    from llama31_405b.config import load_config
    from llama31_405b.train import evaluation
    from llama31_405b.train.hooks import Hook
    from llama31_405b.train.loop import Run

    cfg = load_config(cfg_path, overrides=overrides)
    rec = {"losses": [], "evals": [], "opt_steps_before_run_start": 0,
           "eval_passes_before_run_start": 0, "ptr_after_warmup": {}, "ptr_at_run_start": {}}

    build = Run._build_datasets

    def build_datasets(self):
        PHASE["now"] = "datasets"
        try:
            train, valid = build(self)
        finally:
            PHASE["now"] = "init"
        return _Counting(train), _Counting(valid)
    Run._build_datasets = build_datasets

    schedule = evaluation.run_schedule

    def run_schedule(*a, **k):
        if k.get("forward_only") and PHASE["now"] != "run":
            rec["eval_passes_before_run_start"] += 1
        return schedule(*a, **k)
    evaluation.run_schedule = run_schedule

    run_box = {}

    class Probe(Hook):
        def on_run_start(self, run):
            PHASE["now"] = "run"
            rec["ptr_at_run_start"] = _pointers(run)

        def on_step_end(self, run, stats):
            rec["losses"].append(stats.loss)
            PHASE["step"] = stats.step
            EVENTS["gc_enabled"].append(["step", stats.step, gc.isenabled()])

        def on_eval_start(self, run, step):
            EVENTS["gc_enabled"].append(["eval_start", step, gc.isenabled()])

        def on_eval_end(self, run, step, value, eval_time_s):
            rec["evals"].append([step, value])
            EVENTS["gc_enabled"].append(["eval_end", step, gc.isenabled()])

    # count optimizer steps before run_start and remember the addresses after the last one
    import megatron.core.optimizer as mopt
    make_optimizer = mopt.get_megatron_optimizer

    def get_megatron_optimizer(*a, **k):
        opt = make_optimizer(*a, **k)
        original = opt.step

        def step(*sa, **sk):
            result = original(*sa, **sk)
            if PHASE["now"] != "run":
                rec["opt_steps_before_run_start"] += 1
                rec["ptr_after_warmup"] = _pointers(run_box["run"])
            return result
        opt.step = step
        return opt
    mopt.get_megatron_optimizer = get_megatron_optimizer

    run = Run(cfg, seed=cfg.run.seed_base, hooks=[Probe()], timeout_s=120)
    run_box["run"] = run
    rec["status"] = run.execute()
    rec["reason"] = run.state.reason
    with torch.no_grad():
        h = hashlib.sha256()
        for chunk in run.model:
            for n, p in sorted(chunk.named_parameters()):
                h.update(n.encode())
                h.update(p.detach().to("cpu").contiguous().numpy().tobytes())
    rec["weights_sha256"] = h.hexdigest()
    rec.update(EVENTS)
    rec["gc_collections_logged"] = list(getattr(getattr(run, "gc", None), "collections", []))
    with open(out_path, "w") as f:
        json.dump(rec, f)
    from llama31_405b.parallel.setup import teardown_parallel
    teardown_parallel()  # as `train` does, before interpreter exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
