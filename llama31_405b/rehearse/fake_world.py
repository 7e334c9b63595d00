"""One process as rank r of the config's full world: torch's fake process-group backend.

`torch.testing._internal.distributed.fake_pg` registers the backend "fake" and its `FakeStore`
(torch 2.13). A fake group answers every collective at once and moves no data: group creation,
ranks and sizes are real, the contents of collective outputs are not. It is a private torch
API: `fake_backend()` fails with a clear message when torch no longer has it, and
tests/test_rehearse.py fails loudly when its shape changes.

What moves no data cannot be gathered: the placement check is given the synthetic host table
(rehearse/allocation.py) instead of `all_gather_object`; Megatron's optimizer gathers only its
parameter-group keys, which every rank of this SPMD program computes alike (a dense model, no
per-parameter overrides).
"""
from __future__ import annotations

from ..parallel.distributed import DistEnv

BACKEND = "fake"


class FakeBackendMissing(RuntimeError):
    """torch no longer provides the fake process-group backend the rehearsal uses."""


def fake_backend():
    """The FakeStore class (importing the module registers the "fake" backend)."""
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as e:
        raise FakeBackendMissing(
            f"torch's fake process-group backend is gone ({e}); the rehearsal needs "
            "torch.testing._internal.distributed.fake_pg.FakeStore (torch 2.13: "
            "constraints/cpu.txt)") from None
    import torch.distributed as dist
    if not hasattr(dist.Backend, "FAKE"):
        raise FakeBackendMissing("torch.distributed.Backend has no FAKE backend after importing "
                                 "fake_pg; the rehearsal needs torch 2.13's fake backend")
    return FakeStore


def dist_env(rank: int, world_size: int, host: str, gpus_per_node: int) -> DistEnv:
    """The DistEnv a Slurm task `rank` of the job would see on `host` (block distribution)."""
    return DistEnv(rank=rank, world_size=world_size, local_rank=rank % gpus_per_node,
                   master_addr="rehearsal", master_port=0, hostname=host, launcher="slurm")


def init_fake_world(rank: int, world_size: int) -> None:
    """torch.distributed for rank `rank` of `world_size` on the fake backend. `setup_parallel`
    finds it initialised and goes on to Megatron's groups."""
    import torch.distributed as dist
    store = fake_backend()()
    dist.init_process_group(backend=BACKEND, store=store, rank=rank, world_size=world_size)
