"""One forward/backward over a rank's microbatches with Megatron's pipeline schedule, and the
per-token loss that makes the global-batch loss identical for every layout."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:   # megatron.core is imported after the TE environment check (train.loop)
    from megatron.core.distributed import DistributedDataParallel

    from ..config.schema import Config
    from .protocols import ForwardBackward, LossReport, Microbatch


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> LossReport:
    """Sum of per-token losses and token count (calculate_per_token_loss: Megatron divides the
    gradients by the global token count in finalize_model_grads)."""
    losses = output_tensor.float().reshape(-1)
    mask = loss_mask.float().reshape(-1)
    loss_sum = torch.sum(losses * mask)
    ntok = mask.sum()
    report = torch.stack([loss_sum.detach(), ntok.detach()])
    return loss_sum, ntok.to(torch.int), {"lm loss": report}


def forward_step(data_iterator: Iterator[Microbatch], model: DistributedDataParallel
                 ) -> tuple[torch.Tensor, Callable[[torch.Tensor], LossReport]]:
    batch = next(data_iterator)
    output: torch.Tensor = model(batch["tokens"], batch["position_ids"], None,
                                 labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"])


def _to_device(mb: Microbatch, cp: int, *, gpu: bool) -> Microbatch:
    if gpu:
        mb = {k: v.cuda(non_blocking=True) for k, v in mb.items()}
    if cp > 1:
        # megatron-core 0.19.2: is_hybrid_cp is required, and without cp_group the chunking
        # would use the size and rank of the whole world (utils.py
        # _get_batch_on_this_cp_rank_per_sequence_balancing: get_world_size(cp_group))
        from megatron.core import parallel_state as ps
        from megatron.core.utils import get_batch_on_this_cp_rank
        mb = get_batch_on_this_cp_rank(mb, is_hybrid_cp=False,
                                       cp_group=ps.get_context_parallel_group())
    return mb


def run_schedule(model_chunks: list[DistributedDataParallel], microbatches: list[Microbatch], *,
                 seq_length: int, mbs: int, forward_only: bool, gpu: bool, cp: int = 1,
                 forward_backward: ForwardBackward | None = None) -> torch.Tensor:
    """Forward (and backward) over `microbatches`; returns [loss_sum, tokens] of this rank's
    share (zeros on ranks without the last pipeline stage). `gpu` is the run's device decision;
    `forward_backward` replaces Megatron's schedule function (train.graphs: the full-iteration
    CUDA graph wrapper around it), called with keyword arguments only."""
    mbs_dev = [_to_device(mb, cp, gpu=gpu) for mb in microbatches]
    if not mbs_dev:
        return torch.zeros(2, dtype=torch.float64)
    if forward_backward is None:
        from megatron.core.pipeline_parallel import get_forward_backward_func
        forward_backward = cast("ForwardBackward", get_forward_backward_func())   # unannotated
    iters = [iter(mbs_dev) for _ in model_chunks]
    out = forward_backward(
        forward_step_func=forward_step,
        data_iterator=iters if len(model_chunks) > 1 else iters[0],
        model=model_chunks if len(model_chunks) > 1 else model_chunks[0],
        # full sequence length: Megatron divides by CP (and by TP with SP) for the p2p shapes
        num_microbatches=len(mbs_dev), seq_length=seq_length, micro_batch_size=mbs,
        forward_only=forward_only)
    total = torch.zeros(2, dtype=torch.float64)
    for item in out or []:
        total += item["lm loss"].detach().to("cpu", torch.float64)
    return total


def global_sum(local: torch.Tensor, *, contributes: bool, gpu: bool,
               flags: tuple[float, ...] = ()) -> torch.Tensor:
    """Sum a small [loss_sum, tokens] vector over the whole world; only ranks holding the last
    pipeline stage with TP rank 0 contribute (TP ranks hold identical losses). Every rank gets
    the result, so all stop together on NaN or at the target. `flags` (every rank's, e.g. its
    stop request) ride along in the same all-reduce, summed after the two sums."""
    import torch.distributed as dist
    vec = (local if contributes else torch.zeros_like(local)).to(torch.float64)
    if flags:
        vec = torch.cat([vec, torch.tensor(flags, dtype=torch.float64)])
    if gpu:
        vec = vec.cuda()
    dist.all_reduce(vec)
    return vec.cpu()


def configure_num_microbatches(cfg: Config, *, rank: int) -> int:
    """Set Megatron's global microbatch calculator to this config (GBS, MBS, DP) and return
    the microbatches per step (MiniBS / MBS). The project's schedule passes num_microbatches
    explicitly; Megatron's TECudaGraphHelper (per-layer CUDA graphs) reads the calculator."""
    from megatron.core.num_microbatches_calculator import (
        get_num_microbatches, reconfigure_num_microbatches_calculator)
    d = cfg.derived
    reconfigure_num_microbatches_calculator(
        rank=rank, global_batch_size=d.gbs, micro_batch_size=cfg.batch.micro_batch_size,
        data_parallel_size=d.dp)
    n = get_num_microbatches()
    if n * cfg.batch.micro_batch_size != cfg.batch.minibs:
        raise RuntimeError(f"{cfg.source or '<config>'}: Megatron's microbatch calculator gives "
                           f"{n} microbatches of {cfg.batch.micro_batch_size}, expected MiniBS "
                           f"{cfg.batch.minibs} per DP rank")
    return n
