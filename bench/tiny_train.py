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

Each run is timed twice: wall-clock, the goal's measure, and the CPU time of the process
(`time.process_time`: every thread of the bench, the project's loader thread included). Load
from other processes stretches the wall clock but not the CPU time; a change in the VM's own
speed moves both (on a 2-core VM here both sides ran ~25% faster within 16 minutes, CPU time
with them: see docs/training.md). At `--threads 1` the two measure the same work; with more
threads the CPU time also counts OpenMP workers spinning while they wait.

usage: python bench/tiny_train.py [--config configs/tiny_cpu.toml] [--seed 1] [--pairs 3]
                                  [--steps N] [--threads N]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


# ----------------------------------------------------------------------------- plain PyTorch Llama
class RMSNorm(torch.nn.Module):
    def __init__(self, h, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.nq, self.nkv, self.d = m.num_attention_heads, m.num_query_groups, m.kv_channels
        h = m.hidden_size
        self.ln1, self.ln2 = RMSNorm(h, m.norm_epsilon), RMSNorm(h, m.norm_epsilon)
        # fused QKV in Megatron's grouped layout: per KV group [q heads..., k, v]
        self.qkv = torch.nn.Linear(h, (self.nq + 2 * self.nkv) * self.d, bias=False)
        self.proj = torch.nn.Linear(self.nq * self.d, h, bias=False)
        self.fc1 = torch.nn.Linear(h, 2 * m.ffn_hidden_size, bias=False)   # [gate; up]
        self.fc2 = torch.nn.Linear(m.ffn_hidden_size, h, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        per = self.nq // self.nkv
        qkv = self.qkv(self.ln1(x)).view(b, s, self.nkv, per + 2, self.d)
        q = qkv[:, :, :, :per].reshape(b, s, self.nq, self.d).transpose(1, 2)
        k = qkv[:, :, :, per].transpose(1, 2)
        v = qkv[:, :, :, per + 1].transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k = k.repeat_interleave(per, dim=1)
        v = v.repeat_interleave(per, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, self.nq * self.d))
        g, u = self.fc1(self.ln2(x)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(g) * u)


class PlainLlama(torch.nn.Module):
    def __init__(self, m, vocab, inv_freq):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, m.hidden_size)
        self.blocks = torch.nn.ModuleList(Block(m) for _ in range(m.num_layers))
        self.norm = RMSNorm(m.hidden_size, m.norm_epsilon)
        self.out = torch.nn.Linear(m.hidden_size, vocab, bias=False)
        freqs = torch.outer(torch.arange(m.seq_length, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos()[None, None], persistent=False)
        self.register_buffer("sin", emb.sin()[None, None], persistent=False)

    def forward(self, tokens, labels):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        logits = self.out(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.reshape(-1),
                               reduction="none").view(labels.shape)

    def load_megatron(self, sd):
        """Copy a Megatron local-spec GPTModel state dict (same layout, other names)."""
        own = {"emb.weight": "embedding.word_embeddings.weight", "norm.weight":
               "decoder.final_layernorm.weight", "out.weight": "output_layer.weight"}
        for i in range(len(self.blocks)):
            p = f"decoder.layers.{i}."
            own.update({f"blocks.{i}.ln1.weight": p + "input_layernorm.weight",
                        f"blocks.{i}.ln2.weight": p + "pre_mlp_layernorm.weight",
                        f"blocks.{i}.qkv.weight": p + "self_attention.linear_qkv.weight",
                        f"blocks.{i}.proj.weight": p + "self_attention.linear_proj.weight",
                        f"blocks.{i}.fc1.weight": p + "mlp.linear_fc1.weight",
                        f"blocks.{i}.fc2.weight": p + "mlp.linear_fc2.weight"})
        self.load_state_dict({k: sd[v].clone() for k, v in own.items()}, strict=True)


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


def run_project(cfg, seed, datasets, steps=None):
    """The real run: train.loop.Run with the hooks `train` uses (MLPerf log to a temporary file,
    progress lines), its stdout/stderr copies going to memory."""
    import io
    import tempfile
    from llama31_405b.train.loop import Run
    from llama31_405b.train.mllog import MLPerfLogHook
    from llama31_405b.train.progress import ProgressHook
    clock = _Clock(steps)
    with tempfile.TemporaryDirectory() as tmp:
        hooks = [MLPerfLogHook(cfg, seed=seed, log_file=f"{tmp}/log.txt", rank=0,
                               echo=io.StringIO()),
                 ProgressHook(cfg, rank=0, stream=io.StringIO()), clock.hook]
        run = Run(cfg, seed=seed, hooks=hooks, datasets=datasets)
        status = run.execute()
    n = steps or run.state.step
    return clock.elapsed, n, [(s, v) for s, _, v in run.state.evals], status, clock.evals.total


def run_plain(cfg, seed, datasets, init_sd, steps=None):
    """The plain loop, outside the project's CPU patches (cpu_compat's torch-function mode, which
    the project's setup leaves active in this process): what a PyTorch user's loop pays."""
    from torch.overrides import _get_current_function_mode_stack, _pop_mode_temporarily
    if _get_current_function_mode_stack():
        with _pop_mode_temporarily():
            return run_plain(cfg, seed, datasets, init_sd, steps)
    from llama31_405b.model.rope import llama31_inv_freq
    from llama31_405b.train.batches import eval_microbatches, train_microbatches
    from llama31_405b.train.schedule import LRSchedule
    d = cfg.derived
    torch.manual_seed(seed)
    model = PlainLlama(cfg.model, d.padded_vocab_size, llama31_inv_freq(cfg.model))
    model.load_megatron(init_sd)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "wd_mult": 1.0}, {"params": no_decay, "wd_mult": 0.0}],
                            lr=d.lr, betas=(d.adam_beta1, d.adam_beta2), eps=d.adam_eps)
    sched = LRSchedule.from_config(cfg)
    train_ds, valid_ds = datasets
    mbs = cfg.batch.micro_batch_size
    valid = eval_microbatches(valid_ds, shard=range(d.eval_samples),
                              mbs=cfg.batch.eval_micro_batch_size or mbs)
    t0, eval_time = _now(), _EvalTime()
    step, value, evals = 0, math.inf, []
    while step < (steps or d.max_steps):
        opt.zero_grad(set_to_none=True)
        batches = train_microbatches(train_ds, step=step, gbs=d.gbs, minibs=cfg.batch.minibs,
                                     mbs=mbs, dp_rank=0)
        ntok = sum(float(b["loss_mask"].sum()) for b in batches)
        for b in batches:
            loss = (model(b["tokens"], b["labels"]) * b["loss_mask"]).sum() / ntok
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), d.clip_grad)
        sched.apply(opt, step)
        opt.step()
        step += 1
        if steps:
            continue
        if step >= d.first_eval_step and (step - d.first_eval_step) % d.eval_interval_steps == 0:
            eval_time.start()
            model.eval()
            with torch.no_grad():
                tot = sum(float((model(b["tokens"], b["labels"]) * b["loss_mask"]).sum())
                          for b in valid)
                value = tot / sum(float(b["loss_mask"].sum()) for b in valid)
            model.train()
            eval_time.stop()
            evals.append((step, value))
            if value <= d.target:
                break
    return _since(t0), step, evals, eval_time.total


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
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's); 1 for comparable CPU times")
    args = ap.parse_args()
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
    what = f"{args.steps} steps, no evaluation" if args.steps else "time to target"
    print(f"threads: {torch.get_num_threads()}; config {args.config}; seed {args.seed}; "
          f"{args.pairs} pairs; measure: {what}; {_load_load()}", flush=True)
    # untimed: the first steps of each side in this process (lazy initialisation in torch,
    # Megatron and the data path) would otherwise weigh on the first pair only
    run_project(cfg, args.seed, datasets, 2)
    run_plain(cfg, args.seed, datasets, init_sd, 2)
    ratios, per_step, cpu_ratios, per_eval = [], [], [], []
    for i in range(args.pairs):
        res = {}
        for side in (("project", "plain") if i % 2 == 0 else ("plain", "project")):
            if side == "project":
                t, n, evals, status, te = run_project(cfg, args.seed, datasets, args.steps)
                tail = "" if args.steps else f", status {status}"
            else:
                t, n, evals, te = run_plain(cfg, args.seed, datasets, init_sd, args.steps)
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
        line = (f"pair {i + 1} ({'project first' if i % 2 == 0 else 'plain first'}): ratio "
                f"project/plain {tp / tq:.3f} (training per step {per_step[-1]:.3f}; its CPU time "
                f"{cpu_ratios[-1]:.3f}")
        if kp and kq:
            per_eval.append((ep / kp) / (eq / kq))
            line += f"; per evaluation {per_eval[-1]:.3f}"
        print(f"{line}); {_load_load()}", flush=True)
    import statistics
    med = statistics.median
    print(f"median of {len(ratios)} alternating pairs: ratio project/plain = {med(ratios):.3f} "
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
