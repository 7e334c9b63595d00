"""Process groups for a run: torch.distributed (NCCL on GPU, gloo on CPU) and Megatron's
parallel_state with DP outermost ("tp-cp-ep-pp-dp"), then the model-parallel RNG seeds.

Call order in train: setup_parallel -> placement check -> model build -> checkpoint load.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from ..config.schema import Config
from ..systems.device import Device, decide
from ..systems import load_system
from .cores import pin_process
from .placement import layout_of
from .distributed import DistEnv, dist_env_from_environ, init_process_group


class ParallelSetupError(RuntimeError):
    """The job's world does not match the config's layout."""


@dataclass(frozen=True, slots=True)
class ParallelInfo:
    dist_env: DistEnv
    backend: str
    tp_rank: int
    pp_rank: int
    cp_rank: int
    dp_rank: int
    dp_size: int
    device: Device
    """Where this run computes (systems.device.decide)."""

    @property
    def is_rank0(self) -> bool:
        return self.dist_env.rank == 0


# Any: values of several types (sizes, an order, a path), passed by keyword to megatron-core's
# initialize_model_parallel (tests/test_megatron_keywords.py checks their names)
def megatron_parallel_kwargs(cfg: Config) -> dict[str, Any]:
    """Arguments of megatron's initialize_model_parallel for cfg.parallel.

    Llama is dense, but Megatron still builds expert groups and asserts, for orders that do not
    end in "pp", that the expert DP size equals the DP size. Expert DP is world/(ETP x EP x PP),
    which counts the CP ranks; an expert TP of TP x CP keeps it equal to DP (and the expert
    pipeline groups equal to the dense ones). No expert layer exists, so nothing runs on them.

    performance.nccl_communicator_config (a YAML shipped in configs/) becomes
    nccl_communicator_config_path: Megatron reads it and gives each named NCCL group its options
    (megatron-core 0.19.2 parallel_state.get_nccl_options)."""
    from ..config.paths import shipped_file
    p = cfg.parallel
    kw: dict[str, Any] = dict(tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp,
              virtual_pipeline_model_parallel_size=p.vp if p.vp > 1 else None,
              context_parallel_size=p.cp, expert_model_parallel_size=1,
              expert_tensor_parallel_size=p.tp * p.cp, order=p.order)
    comm = cfg.performance.nccl_communicator_config
    if comm:
        kw["nccl_communicator_config_path"] = str(
            shipped_file(comm, key="performance.nccl_communicator_config"))
    return kw


def setup_parallel(cfg: Config, dist_env: DistEnv | None = None, *,
                   timeout_s: float = 600.0, device: Device | None = None,
                   create_gloo_process_groups: bool = True) -> ParallelInfo:
    """Start torch.distributed for this process and Megatron's groups for cfg.parallel, on
    `device` (default: decide(cfg), which refuses a GPU config in a process without CUDA).

    `create_gloo_process_groups=False`: no gloo side groups (the rehearsal's fake backend, which
    cannot host them; llama31_405b/rehearse)."""
    import torch
    import torch.distributed as dist

    device = device if device is not None else decide(cfg)
    from .. import cpu_compat
    cpu_compat.apply(device)   # before megatron is imported
    from megatron.core import parallel_state as ps
    de = dist_env or dist_env_from_environ()
    d = cfg.derived
    if de.world_size != d.world_size:
        raise ParallelSetupError(
            f"{cfg.source}: the config needs {d.world_size} ranks (TP{cfg.parallel.tp} x "
            f"PP{cfg.parallel.pp} x CP{cfg.parallel.cp} x DP{d.dp}) but the job has "
            f"{de.world_size} ({de.launcher}); fix the task count or system.racks/gpus_per_rack")
    backend = device.backend
    if device.gpu:
        torch.cuda.set_device(de.local_rank)
    elif de.local_world_size and load_system(cfg.system.id).pin_ranks:
        # more ranks than cores: each pinned to one, a pipeline stage's peers together
        pin_process(layout_of(cfg), de.rank, de.local_rank, de.local_world_size)
    if de.launcher == "single" and not dist.is_initialized():
        # one process: an in-memory store instead of a TCP port, so concurrent single-process
        # runs (tests, the tiny benchmark next to other jobs) never collide on MASTER_PORT
        from datetime import timedelta
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timedelta(seconds=timeout_s))
    else:
        init_process_group(de, backend=backend, timeout_s=timeout_s)
    if not ps.model_parallel_is_initialized():
        # megatron-core 0.19.2 initialize_model_parallel annotates whole minutes but only builds
        # timedelta(minutes=...), which takes a fraction: Megatron's groups get the run's
        # timeout to the second (whole minutes made 90 s into 60 s and 15 s into 60 s)
        minutes = cast(int, timeout_s / 60.0)
        ps.initialize_model_parallel(**megatron_parallel_kwargs(cfg),
                                     distributed_timeout_minutes=minutes,
                                     create_gloo_process_groups=create_gloo_process_groups)
    info = ParallelInfo(dist_env=de, backend=backend,
                        tp_rank=ps.get_tensor_model_parallel_rank(),
                        pp_rank=ps.get_pipeline_model_parallel_rank(),
                        cp_rank=ps.get_context_parallel_rank(),
                        dp_rank=ps.get_data_parallel_rank(),
                        dp_size=ps.get_data_parallel_world_size(), device=device)
    if info.dp_size != d.dp:
        raise ParallelSetupError(f"Megatron built DP={info.dp_size}, the config expects {d.dp}")
    return info


def seed_model_parallel(seed: int, *, cuda_graphs: bool = False) -> None:
    """Seed torch and Megatron's model-parallel RNG tracker (same weights across DP, distinct
    dropout streams across TP).

    `cuda_graphs` (GPU and performance.cuda_graphs != "none"): Transformer Engine's graph-safe RNG
    tracker, as Megatron's own training sets it up for CUDA graphs (megatron/training/
    arguments.py turns on te_rng_tracker, initialize.py passes use_cudagraphable_rng): TE's
    make_graphed_callables registers the tracker's generator states with each graph (TE 2.20.2
    pytorch/graph.py make_graphed_callables), megatron.core.full_cuda_graph.FullCudaGraphWrapper
    registers get_all_rng_states() with its graph, and Megatron's plain tracker would get/set
    the CUDA RNG state inside the capture. The caller passes the device decision in: False on
    the CPU."""
    import random

    import numpy as np
    import torch
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed, te_rng_tracker=cuda_graphs,
                                    use_cudagraphable_rng=cuda_graphs)


def teardown_parallel() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
