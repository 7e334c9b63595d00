"""The DP 2 phase (check dp2_eval_sync): do replayed training steps and timed evaluations use
synchronised weights on real CUDA graphs?

Two ranks (one GPU each; gloo processes with --cpu) run the slice at DP 2 with the distributed
optimizer, the overlapped parameter all-gather and gradient reduce-scatter and full-iteration
CUDA graphs, from the same seeded weights (no checkpoint), through the real init (warm-up,
restore) and `--steps` training steps.

What could go stale: with the overlapped gather, `optimizer.step()` updates only this rank's
slice of the BF16 parameters; the rest arrives by the all-gathers the DDP forward pre-hooks issue
while a bucket group's `param_gather_dispatched` is false (megatron-core 0.19.2
`_ParamAndGradBucketGroup.finish_param_sync`). A graph replay runs no Python: it gathers only
where the capture's pre-hooks did. A forced gather (the warm-up restore's) or an evaluation sets
the flags and only a training step's `finish_grad_sync` clears them, so a training graph captured
right after one holds no gather, and its replays train on this rank's slice of step k and the
other rank's of step k - 1 (issue 23), unless the dispatch state is reset before the capture
(train.graphs, `train.gather_dispatch.reset`). The phase therefore runs one warm-up iteration
(WARMUP_ITERS): the training graph is captured on the first step, right after the restore's
forced gather, the one order in which the graph gathers only because of the reset. (After the
slice's three warm-up iterations the capture followed a training step, whose `finish_grad_sync`
had cleared the flags already: the check passed with or without the reset.) The validator
refuses one warm-up iteration with full-iteration graphs for timed runs (the capture would come
after run_start); this phase times nothing.

On every rank:
0. the training graph, right after the first step (the capture) and its optimizer step: one
   replayed forward-backward (`Run._forward_backward`, no optimizer step; the next step zeroes
   its gradients), a hash of the BF16 parameter buffers (`param_hash`), a forced synchronous
   gather (after any gather in flight: `start_param_sync(force_sync=True)` on a bucket group
   with one in flight only waits for it), the hash again: equal when the replay gathered the
   other rank's shard;
then the remaining `--steps` - 1 steps (with --steps >= 2, the default 3, the evaluation also
follows an optimizer step), and:
1. `Run.evaluate()`, the timed-evaluation path (through the evaluation graph);
2. a hash of this rank's BF16 parameter buffers right after it (the weights it scored);
3. the forward pre-hooks disabled and a forced synchronous gather (what Megatron-LM does before
   it evaluates), the hash again, and an eager evaluation of the same validation batches by
   Megatron's schedule itself, which dispatches no gather: every weight it reads was gathered
   and waited for before it (train.evaluation's GatherAhead would start a gather that, with the
   pre-hooks disabled, nothing waits for while the forward passes read the weights).

Passed when, on both ranks, the hashes of 0 are equal, those of 2 and 3 are equal, and the two
evaluation losses are bitwise equal (else within slice.LOSS_RTOL, stated). Two GPUs give DP 2 at
PP 1, so VP 1 only: the training gathers come from the DDP pre-hooks' bucket chain; the
interleaved schedule's (VP > 1, `param_sync_func`) stays covered by the CPU tests
(tests/test_train_eval_sync.py, the replay double). With `--cpu` there are no graphs: every pass
is eager, the pre-hooks gather, and the phase passes with or without the reset (it exercises the
code, not the defect); tests/test_first_contact_dp2_reset.py runs it on the CPU with graph replay
stood in for (tests/helpers/graph_double.py) and sees the check fail without the reset.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict, cast

from .report import Report, Timed
from .slice import REPO, ddp_buffers

if TYPE_CHECKING:   # torch and megatron-core are imported where they are used
    import torch
    from megatron.core.distributed import DistributedDataParallel


TRAIN_SEED = 7_000_101
"""Seed of the synthetic batch of the replayed training step (0)."""
WARMUP_ITERS = 1
"""The phase's warm-up iterations: with one, the training graph is captured on the first step
(builder.graph_capture_iteration), after the warm-up restore's forced gather (docstring)."""
WORKER: tuple[str, ...] = ("-m", "llama31_405b.first_contact.dp2")
"""What each rank's Python runs (then the worker's arguments): this module's `worker`. Tests
put a script there that installs test doubles first, then calls `worker`."""


class RankResult(TypedDict):
    """One rank's side of the check (worker), gathered on rank 0."""
    rank: int
    dp_rank: int
    weights_synchronised: bool
    stale_buffers: int
    train_replay_synchronised: bool
    train_stale_buffers: int


class Dp2Result(TypedDict):
    """The result file rank 0 writes (worker) and the phase reads (run_dp2_phase)."""
    ranks: list[RankResult]
    steps: int
    graphs: bool
    gpu: bool
    warmup_iters: int
    eval_replay: float
    eval_synced: float
    eval_bitwise: bool
    eval_rel_diff: float
    loss_rtol: float
    train_replay_after_step: int
    bucket_count: int


class WorkerArgs(Protocol):
    """The worker's command line (worker's parser)."""
    config: str
    layers: int
    seq_length: int
    steps: int
    compute: str
    system: str | None
    cpu: bool
    result: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]   # Any: an (address, port) pair, typeshed leaves it Any
        return port


def run_dp2_phase(rep: Report, config: str | Path, *, layers: int, seq_length: int, steps: int,
                  cpu: bool, system: str | None, compute: str, timeout_s: float = 900.0) -> None:
    if not cpu:
        import torch
        n = torch.cuda.device_count()
        if n < 2:
            rep.not_run("dp2_eval_sync", f"needs 2 GPUs (this machine has {n})")
            return
    with Timed(rep, "dp2_eval_sync"):
        if steps < 1:   # before any rank starts: the replay check (0) follows the first step
            raise ValueError(f"--steps {steps}: the DP 2 phase needs at least 1 training step "
                             "(its replayed training step follows the first optimizer step)")
        # the ranks' logs and result beside the report file (where it has one: save() makes its
        # folder), else in a temporary folder; named in the check's detail either way, so a run
        # that passes or fails leaves them where its reader looks (never deleted)
        rep.save()
        tmp = Path(tempfile.mkdtemp(prefix="first_contact_dp2_",
                                    dir=rep.path.parent if rep.path else None))
        result = tmp / "result.json"
        port = _free_port()
        cmd = [sys.executable, *WORKER, "--config",
               str(config), "--layers", str(layers), "--seq-length", str(seq_length), "--steps",
               str(steps), "--compute", compute, "--result", str(result)]
        if system:
            cmd += ["--system", system]
        if cpu:
            cmd.append("--cpu")
        procs, logs = [], []
        for r in range(2):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       PYTHONPATH=os.pathsep.join(
                           [str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
            log = open(tmp / f"rank{r}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
        limit = min(timeout_s, rep.time_left() - 5)
        deadline = time.monotonic() + limit
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                time.sleep(5)          # let the other rank report its side, then stop it
                break
            time.sleep(0.5)
        timed_out = any(p.poll() is None for p in procs)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        tails = []
        for r, log in enumerate(logs):
            log.seek(0)
            tails.append(f"rank {r} (exit {procs[r].returncode}): " + log.read()[-1500:])
            log.close()
        if timed_out and not result.exists():
            raise RuntimeError(f"the DP 2 ranks ran past {limit:.0f} s (logs in {tmp}); "
                               + " | ".join(tails))
        if any(p.returncode for p in procs) or not result.exists():
            raise RuntimeError(f"a DP 2 rank failed (logs in {tmp}): " + " | ".join(tails))
        res: Dp2Result = json.loads(result.read_text())   # Any: JSON, written by worker
        same_w = all(r["weights_synchronised"] for r in res["ranks"])
        same_t = all(r["train_replay_synchronised"] for r in res["ranks"])
        same_l = res["eval_bitwise"] or res["eval_rel_diff"] <= res["loss_rtol"]
        detail = (f"DP 2, distributed optimizer, overlapped gather, "
                  f"{'full-iteration graphs' if res['graphs'] else 'eager (CPU)'}; after "
                  f"{res['steps']} steps: evaluation {res['eval_replay']:.6f}, forced-sync eager "
                  f"{res['eval_synced']:.6f} ({'bitwise' if res['eval_bitwise'] else 'relative %.2e' % res['eval_rel_diff']}); "
                  + ("a replayed training step gathered the synchronised weights on both ranks; "
                     if same_t else "STALE TRAINING GRAPH: ranks " + ", ".join(
                         str(r["rank"]) for r in res["ranks"] if not r["train_replay_synchronised"])
                     + " trained on weights that differ from the synchronised ones; ")
                  + ("weights scored = synchronised weights on both ranks" if same_w else
                     "STALE: ranks " + ", ".join(str(r["rank"]) for r in res["ranks"]
                                                 if not r["weights_synchronised"])
                     + " scored weights that differ from the synchronised ones")
                  + f"; the ranks' logs in {tmp}")
        if same_w and same_l and same_t:
            rep.passed("dp2_eval_sync", detail, **res)
        else:
            rep.failed("dp2_eval_sync", detail, **res)


def param_hash(model: Sequence[DistributedDataParallel]) -> torch.Tensor:
    """One int64 per DDP parameter buffer: sum of its 16-bit words x (position mod 65521 + 1),
    on the device, in chunks (any changed element changes it, barring collisions)."""
    import torch
    out = []
    chunk = 1 << 26
    for m in model:
        for b in ddp_buffers(m):
            assert b.param_data is not None   # the distributed optimizer's (the phase's setting)
            v = b.param_data.detach().reshape(-1).view(torch.int16)
            acc = torch.zeros((), dtype=torch.int64, device=v.device)
            for s in range(0, v.numel(), chunk):
                c = v[s:s + chunk].to(torch.int64)
                idx = torch.arange(s, s + c.numel(), device=v.device, dtype=torch.int64)
                acc += (c * (idx % 65521 + 1)).sum()
            out.append(acc)
    return torch.stack(out)


def worker(argv: Sequence[str] | None = None) -> int:
    import argparse
    import dataclasses

    import torch
    ap = argparse.ArgumentParser(description="one rank of first-contact's DP 2 phase")
    ap.add_argument("--config", required=True)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--seq-length", type=int, required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--compute", required=True)
    ap.add_argument("--system", default=None)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--result", required=True)
    a: WorkerArgs = ap.parse_args(argv)
    if a.steps < 1:
        ap.error(f"--steps {a.steps}: at least 1 (the replayed training step follows the first "
                 "optimizer step)")

    from ..config import launch_env, load_config
    from ..train.batches import synthetic_microbatches
    from ..train.evaluation import eval_batches, evaluate
    from ..train.gather_dispatch import finish_in_flight
    from ..train.loop import Run
    from .slice import LOSS_RTOL, compare, slice_config, synthetic_datasets
    cfg = load_config(a.config, validate=False)
    for k, v in launch_env(cfg).items():
        os.environ.setdefault(k, v)
    r = dataclasses.replace
    scfg = slice_config(cfg, compute=a.compute, layers=a.layers, seq_length=a.seq_length,
                        steps=a.steps, system="cpu" if a.cpu else a.system, ckpt_dir="",
                        gaf=False, dp=2, graphs=not a.cpu, keep_width=not a.cpu)
    # the settings under test, whatever the config says; one warm-up iteration: the training
    # graph is captured on the first step, right after the restore's forced gather (docstring)
    scfg = r(scfg, optimizer=r(scfg.optimizer, distributed=True),
             performance=r(scfg.performance, overlap_param_gather=True, overlap_grad_reduce=True),
             run=r(scfg.run, warmup_iters=WARMUP_ITERS))
    run = Run(scfg, seed=1234, hooks=[], init_checkpoint="", datasets=synthetic_datasets(scfg))
    try:
        run._init()
        run.train_step()                            # the training capture (with graphs)
        # the training graph (0): a replay right after the first step's optimizer step
        tokens = dict(seq_length=scfg.model.seq_length, vocab_size=scfg.model.vocab_size)
        run._zero_grads()
        run._forward_backward(synthetic_microbatches(
            scfg.derived.num_microbatches, mbs=scfg.batch.micro_batch_size,
            seed=TRAIN_SEED, **tokens))
        trained = param_hash(run.model)
        with torch.no_grad():                       # a forced gather, after any in flight
            for m in run.model:
                finish_in_flight(m)
                m.start_param_sync(force_sync=True)
        train_synced = param_hash(run.model)
        for _ in range(a.steps - 1):
            run.train_step()
        value = run.evaluate()                      # the timed-evaluation path (1)
        seen = param_hash(run.model)                # (2)
        for m in run.model:                         # (3) pre-hooks off, as Megatron-LM evaluates
            m.disable_forward_pre_hook(param_sync=False)
        with torch.no_grad():                       # its forced gather, after any in flight
            for m in run.model:
                finish_in_flight(m)
                m.start_param_sync(force_sync=True)
        synced = param_hash(run.model)
        # Megatron's schedule itself: no gather is dispatched during the pass (the gathering
        # evaluation's GatherAhead would start one that, with the pre-hooks off, nobody waits
        # for while the forward passes read the weights). Imported after the init: it imports
        # megatron.core, which the init's environment checks precede.
        from megatron.core.pipeline_parallel import get_forward_backward_func
        ref = evaluate(run.model, eval_batches(run.valid_ds, scfg, dp_rank=run.info.dp_rank,
                                               dp=run.info.dp_size),
                       scfg, last_stage=run.last_stage, tp_rank=0, gpu=run.device.gpu,
                       forward_only_fn=get_forward_backward_func())
        for m in run.model:
            m.enable_forward_pre_hook()
        mine: RankResult = {
            "rank": run.info.dist_env.rank, "dp_rank": run.info.dp_rank,
            "weights_synchronised": bool(torch.equal(seen.cpu(), synced.cpu())),
            "stale_buffers": int((seen != synced).sum()),
            "train_replay_synchronised": bool(torch.equal(trained.cpu(), train_synced.cpu())),
            "train_stale_buffers": int((trained != train_synced).sum())}
        ranks: list[RankResult | None] = [None, None]
        torch.distributed.all_gather_object(ranks, mine)
        if run.info.dist_env.rank == 0:
            same, rel = compare(value, ref)
            doc: Dp2Result = {
                # every rank's, filled by all_gather_object
                "ranks": cast("list[RankResult]", ranks), "steps": a.steps,
                "graphs": run._graphs is not None,
                "gpu": run.device.gpu, "warmup_iters": WARMUP_ITERS,
                "eval_replay": value, "eval_synced": ref, "eval_bitwise": same,
                "eval_rel_diff": rel, "loss_rtol": LOSS_RTOL, "train_replay_after_step": 1,
                "bucket_count": len(seen)}
            Path(a.result).write_text(json.dumps(doc, indent=2))
    finally:
        run.close()
        from ..parallel.setup import teardown_parallel
        teardown_parallel()
    return 0


if __name__ == "__main__":
    sys.exit(worker())
