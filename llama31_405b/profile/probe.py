"""The precision probe: how fast this CPU runs the run's GEMM and attention shapes in FP32 and in
BF16, measured where no datasheet says it.

A CPU's BF16 rate depends on its units and on PyTorch's kernels for them: on a CPU without BF16
units (AVX2) a BF16 matrix product runs some 20x slower than FP32, where one with AVX512-BF16 or
AMX runs it faster. The planner's CPU system file cannot know which; a profile of an FP32 layout
cannot either. So `profile` on CPU runs this probe on rank 0 before its steps (the other ranks
wait in their first collective) and records it in rank 0's record (`precision_probe`), and the
calibration prices each precision the profile did not run by the probe's ratio to one it did
(planner/calibrate/precisions.py).

Two operations, each in both precisions, on the run's own shapes, the faster of 5 timings
(alternating precisions, so that a drift meets both alike), forward and backward:

* gemm: the LM head of one microbatch ((tokens x hidden) @ (hidden x vocab / TP), with its
  data- and weight-gradient products);
* attention: megatron-core 0.19.2's unfused attention core (`DotProductAttention.forward`:
  `torch.baddbmm` of the scores, the causal mask, softmax, `torch.bmm` with the values) for one
  microbatch and the heads of one TP rank.
"""
from __future__ import annotations

import time

OPERATIONS = ("gemm", "attention")
PRECISIONS = ("fp32", "bf16")
REPEATS = 5


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _gemm(torch, dtype, tokens: int, hidden: int, vocab: int):
    x = torch.randn(tokens, hidden, dtype=dtype)
    w = torch.randn(vocab, hidden, dtype=dtype)
    g = torch.randn(tokens, vocab, dtype=dtype)

    def run():
        x @ w.t()       # forward
        g @ w           # data gradient
        g.t() @ x       # weight gradient
    return run


def _attention(torch, dtype, heads: int, seq: int, kv: int):
    q, k, v = (torch.randn(heads, seq, kv, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    empty = torch.empty(heads, seq, seq, dtype=dtype)

    def run():
        s = torch.baddbmm(empty, q, k.transpose(1, 2), beta=0.0, alpha=kv ** -0.5)
        p = torch.softmax(s.masked_fill(mask, -10000.0), dim=-1)
        torch.bmm(p, v).sum().backward()
    return run


def shapes(cfg) -> dict[str, list[int]]:
    """The probe's shapes for config `cfg`: the LM head's (tokens, hidden, vocab / TP) and the
    attention's (heads per TP rank x microbatch, sequence, head size)."""
    m, p = cfg.model, cfg.parallel
    mbs = cfg.batch.micro_batch_size
    vocab = cfg.derived.padded_vocab_size
    return {"gemm": [mbs * m.seq_length, m.hidden_size, vocab // p.tp],
            "attention": [mbs * m.num_attention_heads // p.tp, m.seq_length, m.kv_channels]}


def run_probe(cfg, repeats: int = REPEATS) -> dict:
    """The probe on this process's threads: {"seconds": {"<operation>_<precision>": s},
    "shapes": ..., "threads": n}."""
    import torch
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    sh = shapes(cfg)
    fns = {}
    for prec in PRECISIONS:
        fns[f"gemm_{prec}"] = _gemm(torch, dtypes[prec], *sh["gemm"])
        fns[f"attention_{prec}"] = _attention(torch, dtypes[prec], *sh["attention"])
    best = {k: float("inf") for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            best[k] = min(best[k], _time(fn))
    return {"seconds": best, "shapes": sh, "threads": torch.get_num_threads(),
            "what": "profile/probe.py: the faster of "
                    f"{repeats} timings, forward and backward, on rank 0 before the steps"}
