"""The planner's DDP buckets are megatron-core 0.19.2's (model revision 16): planner
comm.dp_bucket_sizes against `DistributedOptimizer._compute_per_buffer_param_layout` and DDP's
`_compute_default_per_buffer_param_layout` on meta tensors of the same sizes, for the parameter
lists costs.chunk_param_sizes gives (the tiny GB200-settings chunk, the 405B GB200 chunk) and for
random ones; the planner's first chunk on the published GB200 layout; the default bucket size.
The real model's layout is compared in tests/test_ddp_layout.py."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from conftest import REPO
from llama31_405b.config import load_config
from llama31_405b.planner import comm, costs
from llama31_405b.planner.calibrate import fitted
from llama31_405b.planner.context import Context


def _megatron(sizes: list[int], bucket: int, dp: int) -> tuple[list[int], list[int]]:
    from megatron.core.distributed.param_and_grad_buffer import (
        _compute_default_per_buffer_param_layout)
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    params = [torch.nn.Parameter(torch.empty(n, device="meta")) for n in sizes]
    dcfg = SimpleNamespace(pad_buckets_for_high_nccl_busbw=False)
    dist = DistributedOptimizer._compute_per_buffer_param_layout(params, bucket, dp, dcfg)
    plain = _compute_default_per_buffer_param_layout(params, bucket)
    return list(dist.per_bucket_numel_unpadded), list(plain.per_bucket_numel_unpadded)


def _sizes(config: str, rank: int = 0, chunk: int = 0) -> tuple[Context, list[int]]:
    ctx = Context.of(load_config(REPO / "configs" / config))
    from llama31_405b.planner.pipeline import chunk_layers
    layers = chunk_layers(ctx, rank, chunk) if ctx.pp > 1 else ctx.model.num_layers
    sizes = costs.chunk_param_sizes(ctx, layers, rank == 0 and chunk == 0,
                                    rank == ctx.pp - 1 and chunk == ctx.vp - 1)
    assert all(float(n).is_integer() for n in sizes)
    return ctx, [int(n) for n in sizes]


@pytest.mark.parametrize("config", ["tiny_cpu_gb200.toml", "config_GB200_2048x4x8xtp4pp8cp2.toml",
                                    "config_GB200_128x4x144xtp4pp8cp2.toml"])
def test_the_first_chunks_buckets_are_megatrons(config):
    ctx, sizes = _sizes(config)
    bucket = int(comm.dp_bucket_params(ctx))
    dist, plain = _megatron(sizes, bucket, ctx.dp * ctx.cp)
    mine = comm.dp_bucket_sizes(sizes, bucket)
    assert list(mine) == dist == plain
    ch = costs.plan(ctx, fitted()).chunks[0][0]
    assert ch.buckets == len(dist)
    assert ch.first_bucket_share == pytest.approx(dist[0] / sum(dist))
    assert ch.last_bucket_share == pytest.approx(dist[-1] / sum(dist))


def test_the_tiny_chunk_has_four_buckets_the_embeddings_the_last():
    """tiny_cpu_gb200's first chunk (the embedding and one layer, 32,768-element buckets): the
    count its profiles show (4 all-gathers per step on rank 0), where ceil(params / bucket)
    gave 22."""
    ctx, sizes = _sizes("tiny_cpu_gb200.toml")
    got = comm.dp_bucket_sizes(sizes, comm.dp_bucket_params(ctx))
    assert got == (45056, 90112, 32896, 540800)
    assert -(-sum(sizes) // 32768) == 22


@pytest.mark.parametrize("seed", range(20))
def test_random_parameter_lists_lay_out_as_megatron_does(seed):
    rng = random.Random(seed)
    sizes = [64 * rng.choice([1, 2, 5, 40, 300, 2000, 9000]) for _ in range(rng.randint(1, 40))]
    bucket = rng.choice([64, 1000, 40_000, 200_000, 10**9])
    dist, plain = _megatron(sizes, bucket, 2)
    assert list(comm.dp_bucket_sizes(sizes, bucket)) == dist == plain


def test_later_chunks_and_pipeline_ranks_are_one_bucket():
    ctx, _ = _sizes("config_GB200_2048x4x8xtp4pp8cp2.toml")
    p = costs.plan(ctx, fitted())
    assert p.chunks[0][0].buckets > 1
    rest = [c for r, row in enumerate(p.chunks) for i, c in enumerate(row) if (r, i) != (0, 0)]
    assert all(c.buckets == 1 and c.first_bucket_share == c.last_bucket_share == 1.0 for c in rest)


def test_the_default_bucket_size_grows_with_dp_without_cp():
    """megatron-core 0.19.2 DistributedDataParallel.__init__: max(40M, 1M x the DP group without
    CP); 1M x DP x CP before model revision 16."""
    cfg = load_config(REPO / "configs" / "config_GB200_2048x4x8xtp4pp8cp2.toml",
                      overrides={"performance": {"ddp_bucket_size": None}})
    ctx = Context.of(cfg)
    assert (ctx.dp, ctx.cp) == (128, 2)
    assert comm.dp_bucket_params(ctx) == 128e6


def test_without_the_overlapped_reduce_scatter_a_chunk_is_one_bucket():
    """megatron-core 0.19.2 DistributedDataParallel.__init__ sets `bucket_size` to None (one
    bucket a buffer) where `overlap_grad_reduce` is off, whatever the config gave (model revision
    20: the planner had laid the config's buckets), as model.builder's layout does."""
    on = Context.of(load_config(REPO / "configs" / "tiny_cpu_gb200.toml"))
    off = Context.of(load_config(REPO / "configs" / "tiny_cpu_gb200.toml",
                                 overrides={"performance": {"overlap_grad_reduce": False,
                                                            "overlap_param_gather": False}}))
    assert on.cfg.performance.ddp_bucket_size == off.cfg.performance.ddp_bucket_size == 32768
    assert comm.dp_bucket_params(on) == 32768 and comm.dp_bucket_params(off) == float("inf")
    assert costs.plan(on, fitted()).chunks[0][0].buckets > 1
    first = costs.plan(off, fitted()).chunks[0][0]
    assert first.buckets == 1 and first.first_bucket_share == first.last_bucket_share == 1.0
