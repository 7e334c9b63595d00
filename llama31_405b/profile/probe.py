"""The precision probe: how fast this CPU runs the run's GEMM and attention shapes in FP32 and in
BF16, measured where no datasheet says it.

A CPU's BF16 rate depends on its units and on PyTorch's kernels for them: on a CPU without BF16
units (AVX2) a BF16 matrix product runs some 20x slower than FP32, where one with AVX512-BF16 or
AMX runs it faster. The planner's CPU system file cannot know which; a profile of an FP32 layout
cannot either. So `profile` on CPU runs this probe on rank 0 before its steps (the other ranks
wait at a barrier) and records it in rank 0's record (`precision_probe`), and the
calibration prices each precision the profile did not run by the probe's ratio to one it did
(planner/calibrate/precisions.py).

Two operations, each in both precisions, on the run's own shapes, the fastest of 5 timings
(alternating precisions, so that a drift meets both alike), forward and backward:

* gemm: the LM head of one microbatch ((tokens x hidden) @ (hidden x vocab / TP), with its
  data- and weight-gradient products);
* attention: megatron-core 0.19.2's unfused attention core for one microbatch and the heads of
  one TP rank, its operations in its layouts (`DotProductAttention.forward`: the keys and values
  repeated over the query groups, `torch.baddbmm` of the scores from transposed views, then
  `FusedScaleMaskSoftmax.forward_torch_softmax` with `attention_softmax_in_fp32`, megatron's
  default: the scores in FP32, the causal mask filled in place, softmax, back to the input's
  precision; `torch.bmm` with the values; the context made contiguous in [s, b, h] order).

Model revision 7 adds, each in both precisions:

* attention-b<B>: the same attention core at bmm batches B = (the query heads' repeat over one
  query group) x 1, 2, 4 and 8 (`LADDER`), one query group: BF16's slowdown on a CPU grows with
  the batch of its matrix products (some 4-6x at a batch of 2, 10-12x from 8 on this project's
  2-core machine), so the ladder prices a layout whose microbatch or TP split differs from the
  fit's (`compute.probe_factor` takes the rung of its own batch, mbs x heads / TP);
* elementwise: one layer's non-GEMM work on the run's activations (megatron's RMSNorm,
  torch.nn.functional.rms_norm, the residual add and SwiGLU, forward and backward): the rate of
  elementwise passes over activations held in another precision (BF16 parameters keep BF16
  activations).

Model revision 8 adds the FFN's up-projection as one linear layer, forward and backward:
"ffn_fp32" and "ffn_bf16" (torch's linear), and "ffn_nvfp4", the project's emulated NVFP4 linear
(precision/linear.py `nvfp4_linear`, its default recipe, on BF16 operands as an NVFP4 run's
parameters are): what the emulation's quantisation adds to a linear layer on this CPU.

From 2026-12-07 05:20 UTC (with model revision 17; the probe's figures are measurements a
summary keeps, so earlier runs re-derive as they were) the three linears ("ffn_*") are timed in
bursts of `BURST` calls back to back, keeping the fastest call: alone among the probe's
operations, the emulated NVFP4 linear (some twenty small operations around its GEMM) ran
1.5-2.1x the FP32 linear when called once after the other operations (the probes of the proof's
fit layouts, 2026-12-07: 1.39-2.32 ms against 0.74-1.46 ms) and 1.2-1.3x when called again at
once (a standalone probe, 2026-12-07 05:17 UTC), nearer what a training step pays:
tiny_cpu_gb200 at DP2 with microbatches of 2 spent 7 ms a step in the quantisation's operations
(`compute.other` 13.1-13.5 ms against 5.8-6.5 ms with BF16 linears, one profile each, 8 steps),
where the single-call ratio of the fit layouts priced 59 ms and a burst's prices 13-23 (the
emulation's Python shows as host time, which this does not price). The other operations keep
single calls: the elementwise work's BF16 / FP32 ratio was 1.0-1.1 single and 1.3-1.45 in
bursts, and a training step's (the norms, SwiGLU and the rest of the attention per layer pass,
tiny_cpu at DP2 against tiny_cpu_gb200 at DP2) 0.96-0.97. The evidence:
docs/planner_proof/quantisation/2026-12-07T0514Z/.

The first version (model revision 6 as first committed, 2cbbc97: the proof runs T1815Z and
T1846Z and the fourth set of layouts ran it) timed the attention without the query groups'
repeat, with softmax in the input's precision and on contiguous operands.
"""
from __future__ import annotations

import time

OPERATIONS = ("gemm", "attention", "elementwise")
LADDER = (1, 2, 4, 8)
"""Multiples of the query heads' repeat over a group: the attention rungs' bmm batches."""
PRECISIONS = ("fp32", "bf16")
REPEATS = 5
BURST = 3
"""Calls back to back per repeat for the linears ("ffn_*"), the fastest kept (from 2026-12-07)."""


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


def _attention(torch, dtype, mbs: int, heads: int, groups: int, seq: int, kv: int):
    q = torch.randn(seq, mbs, heads, kv, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(seq, mbs, groups, kv, dtype=dtype, requires_grad=True) for _ in range(2))
    mask = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    empty = torch.empty(mbs * heads, seq, seq, dtype=dtype)
    n = mbs * heads

    def run():
        kk = k.repeat_interleave(heads // groups, dim=2).view(seq, n, kv)
        vv = v.repeat_interleave(heads // groups, dim=2).view(seq, n, kv)
        s = torch.baddbmm(empty, q.reshape(seq, n, kv).transpose(0, 1),
                          kk.transpose(0, 1).transpose(1, 2), beta=0.0, alpha=kv ** -0.5)
        s = s.view(mbs, heads, seq, seq).float()            # attention_softmax_in_fp32
        p = torch.softmax(s.masked_fill_(mask, -10000.0), dim=-1).to(dtype)
        c = torch.bmm(p.view(n, seq, seq), vv.transpose(0, 1))
        c.view(mbs, heads, seq, kv).permute(2, 0, 1, 3).contiguous().sum().backward()
    return run


def _linear(torch, dtype, shape: list[int], nvfp4: bool):
    from ..precision.linear import nvfp4_linear
    tokens, hidden, out = shape
    x = torch.randn(tokens, hidden, dtype=dtype, requires_grad=True)
    w = torch.randn(out, hidden, dtype=dtype, requires_grad=True)
    fn = nvfp4_linear if nvfp4 else torch.nn.functional.linear

    def run():
        fn(x, w).sum().backward()
    return run


def _elementwise(torch, dtype, tokens: int, hidden: int, ffn: int):
    x = torch.randn(tokens, hidden, dtype=dtype, requires_grad=True)
    w = torch.ones(hidden, dtype=dtype, requires_grad=True)
    a = torch.randn(tokens, 2 * ffn, dtype=dtype, requires_grad=True)
    f = torch.nn.functional

    def run():
        n = f.rms_norm(x, (hidden,), w, 1e-5)          # the layer's norm
        u, g = a.chunk(2, dim=-1)
        y = f.silu(u) * g                               # SwiGLU
        ((n + x).sum() + y.sum()).backward()            # the residual add; both backward
    return run


def shapes(cfg) -> dict[str, list[int]]:
    """The probe's shapes for config `cfg`: the LM head's (tokens, hidden, vocab / TP), the
    attention's (microbatch, heads and query groups per TP rank, sequence, head size), the
    attention rungs' (bmm batch, the heads' repeat over a group, sequence, head size), the
    elementwise work's (tokens, hidden, FFN width per TP rank)."""
    m, p = cfg.model, cfg.parallel
    mbs = cfg.batch.micro_batch_size
    vocab = cfg.derived.padded_vocab_size
    rep = m.num_attention_heads // m.num_query_groups
    return {"gemm": [mbs * m.seq_length, m.hidden_size, vocab // p.tp],
            "attention": [mbs, m.num_attention_heads // p.tp, m.num_query_groups // p.tp,
                          m.seq_length, m.kv_channels],
            **{f"attention-b{rep * k}": [rep * k, rep, m.seq_length, m.kv_channels]
               for k in LADDER},
            "elementwise": [mbs * m.seq_length, m.hidden_size, m.ffn_hidden_size // p.tp],
            "ffn": [mbs * m.seq_length, m.hidden_size, 2 * m.ffn_hidden_size // p.tp]}


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
        fns[f"elementwise_{prec}"] = _elementwise(torch, dtypes[prec], *sh["elementwise"])
        fns[f"ffn_{prec}"] = _linear(torch, dtypes[prec], sh["ffn"], nvfp4=False)
        for op in (k for k in sh if k.startswith("attention-b")):
            b, rep, seq, kv = sh[op]
            fns[f"{op}_{prec}"] = _attention(torch, dtypes[prec], b // rep, rep, 1, seq, kv)
    fns["ffn_nvfp4"] = _linear(torch, torch.bfloat16, sh["ffn"], nvfp4=True)
    best = {k: float("inf") for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            for _ in range(BURST if k.startswith("ffn_") else 1):
                best[k] = min(best[k], _time(fn))
    return {"seconds": best, "shapes": sh, "threads": torch.get_num_threads(),
            "what": "profile/probe.py: the fastest of "
                    f"{repeats} timings ({BURST} calls back to back each for the linears), "
                    "forward and backward, on rank 0 before the steps"}
