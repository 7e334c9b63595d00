"""Which samples each rank reads, and microbatches for Megatron's pipeline schedule.

Training: step k (0-based) consumes global samples [k*GBS, (k+1)*GBS) of the train dataset; DP
rank r takes the r-th MiniBS slice, cut into MiniBS/MBS microbatches. The sample order is a
function of the step only, so any layout (and a resumed or warmed-up run) sees the same data.

Evaluation: the eval_samples validation sequences are split into contiguous shards over DP ranks
(the first eval_samples % DP ranks take one more), so every sequence is evaluated exactly once
even when DP does not divide eval_samples; the last microbatch of a shard is padded with a
fully masked copy.

Warm-up (before run_start): `synthetic_microbatches` gives microbatches of the same count, shapes
and dtypes as the real ones, from a fixed-seed generator of its own, so the warm-up never reads
the dataset and draws nothing from the run's random streams.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .protocols import Microbatch, Samples

KEYS = ("tokens", "labels", "loss_mask", "position_ids")
DTYPES = {"tokens": torch.int64, "labels": torch.int64, "loss_mask": torch.float32,
          "position_ids": torch.int64}
"""What the datasets give (megatron-core GPTDataset and data.datasets.PackedValidationDataset);
the full-iteration CUDA graphs copy every microbatch into buffers made from the first one."""


def _stack(items: list[Mapping[str, object]]) -> Microbatch:
    return {k: torch.stack([torch.as_tensor(it[k]) for it in items]) for k in KEYS}


def train_microbatches(dataset: Samples, *, step: int, gbs: int, minibs: int, mbs: int,
                       dp_rank: int) -> list[Microbatch]:
    start = step * gbs + dp_rank * minibs
    idx = list(range(start, start + minibs))
    return [_stack([dataset[i] for i in idx[j:j + mbs]]) for j in range(0, minibs, mbs)]


def eval_shard(eval_samples: int, dp: int, dp_rank: int) -> range:
    base, extra = divmod(eval_samples, dp)
    start = dp_rank * base + min(dp_rank, extra)
    return range(start, start + base + (dp_rank < extra))


def eval_microbatch_count(shard_len: int, mbs: int, multiple_of: int = 1) -> int:
    """How many microbatches eval_microbatches gives for a shard of `shard_len` sequences."""
    n = -(-shard_len // mbs)
    return -(-n // multiple_of) * multiple_of if n else 0


def synthetic_microbatches(count: int, *, mbs: int, seq_length: int, vocab_size: int,
                           seed: int) -> list[Microbatch]:
    """`count` microbatches of random token ids in [0, vocab_size), unmasked, drawn from a
    generator seeded with `seed` (the global random streams are not touched)."""
    gen = torch.Generator().manual_seed(seed)
    out: list[Microbatch] = []
    for _ in range(count):
        text = torch.randint(0, vocab_size, (mbs, seq_length + 1), generator=gen,
                             dtype=DTYPES["tokens"])
        out.append({"tokens": text[:, :-1].contiguous(), "labels": text[:, 1:].contiguous(),
                    "loss_mask": torch.ones(mbs, seq_length, dtype=DTYPES["loss_mask"]),
                    "position_ids": torch.arange(seq_length, dtype=DTYPES["position_ids"])
                    .expand(mbs, seq_length).contiguous()})
    return out


def eval_microbatches(dataset: Samples, *, shard: range, mbs: int,
                      multiple_of: int = 1) -> list[Microbatch]:
    """Microbatches covering `shard`; padding rows (and whole padding microbatches, when the
    interleaved schedule needs a multiple of PP) have loss_mask 0."""
    out: list[Microbatch] = []
    idx = list(shard)
    for j in range(0, len(idx), mbs):
        items = [dataset[i] for i in idx[j:j + mbs]]
        real = len(items)
        while len(items) < mbs:
            items.append(dataset[idx[0]])
        mb = _stack(items)
        if real < mbs:
            mb["loss_mask"] = mb["loss_mask"].clone()
            mb["loss_mask"][real:] = 0
        out.append(mb)
    while out and len(out) % multiple_of:
        pad = {k: v.clone() for k, v in out[0].items()}
        pad["loss_mask"].zero_()
        out.append(pad)
    return out
