"""One rank of the launch, played in this process (one per rank: a fork of rehearse/forks.py's
server, or a new interpreter):

    python -m llama31_405b.rehearse.rank CONFIG --rank R --out FILE [--allocation F] [--set K=V]

Phases, timed, in the order `train` runs them (train/loop.py Run._init):
1. process group: torch's fake backend at the config's world size (rehearse/fake_world.py);
2. setup_parallel: the project's own path to Megatron's groups (without gloo side groups), and
   Megatron's TP, CP, PP, DP and DP x CP groups compared with the arithmetic the placement
   check reasons over (parallel/layout.py);
3. placement: the placement check's verdict on the synthetic allocation (rehearse/allocation.py);
4. model: the rank's model chunks, built by model/builder.py on the meta device with the run's
   TransformerConfig, changed only where Megatron's local layer spec needs it (CONFIG_CHANGES);
   then the bytes the rank reads from the initial checkpoint (checkpoint/read_plan.py);
5. ddp: Megatron's DDP around each chunk (contiguous parameter and gradient buffers);
6. optimizer: Megatron's distributed optimizer (FP32 master shards) and its Adam state, created
   by the optimizer's own `init_state_fn` (what a checkpoint load does before the first step).
Bytes come from those buffers and tensors (rehearse/measure.py). The result, or the first
failure and its phase, goes to FILE as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
from typing import Any

# Any: values of several TransformerConfig field types, passed to dataclasses.replace by name
CONFIG_CHANGES: dict[str, Any] = {"sequence_parallel": False, "context_parallel_size": 1,
                                  "use_cpu_initialization": False}
"""TransformerConfig fields the rehearsal sets for Megatron's local spec on the meta device. The
local spec's norm refuses sequence parallelism (megatron-core 0.19.2 torch_norm.WrappedTorchNorm)
and its attention CP > 1 (dot_product_attention.DotProductAttention); neither changes a
parameter's shape (SP splits activations, CP sequences), and DDP and the optimizer take their
DP x CP groups from parallel_state, which keeps the real CP. `use_cpu_initialization=False` is
the GPU run's value (parameters are created at torch.cuda.current_device(): here "meta")."""

COMPARED_GROUPS = {"tp": "tp", "cp": "cp", "pp": "pp", "dp": "dp", "dp_cp": "cp-dp"}
"""Megatron group -> the dimensions of parallel/layout.py it must equal."""


def _groups(cfg, rank: int) -> tuple[dict, list[str]]:
    """Sizes of Megatron's groups of this rank, and every difference from the layout
    arithmetic."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from ..parallel.placement import layout_of
    found = {"tp": ps.get_tensor_model_parallel_group(), "cp": ps.get_context_parallel_group(),
             "pp": ps.get_pipeline_model_parallel_group(), "dp": ps.get_data_parallel_group(),
             "dp_cp": ps.get_data_parallel_group(with_context_parallel=True),
             "model": ps.get_model_parallel_group(),
             "embedding": ps.get_embedding_group(check_initialized=False)}
    ranks = {k: (dist.get_process_group_ranks(g) if g is not None else []) for k, g in
             found.items()}
    layout = layout_of(cfg)
    wrong = []
    for name, dims in COMPARED_GROUPS.items():
        want = layout.group_of(dims, rank)
        if sorted(ranks[name]) != want:
            wrong.append(f"Megatron's {name} group of rank {rank} is {_short(ranks[name])}, "
                         f"the placement check's layout says {_short(want)}")
    return {k: len(v) for k, v in ranks.items()}, wrong


def _short(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 8 else f"[{ranks[0]}, {ranks[1]}, ... {ranks[-1]}] " \
                                               f"({len(ranks)} ranks)"


def _quantized_params(cfg) -> str | None:
    """"fp8" / "nvfp4" when the run's parameters are Transformer Engine's quantized tensors
    (the FP8/NVFP4 parameter gather), which Megatron's local spec cannot build: the rehearsal's
    parameter buffers are then BF16, not the run's."""
    perf = cfg.performance
    return "nvfp4" if perf.fp4_param_gather else "fp8" if perf.fp8_param_gather else None


def _nccl_summary() -> dict:
    """The NCCL options Megatron derived from the communicator YAML (meta_compat patch 4), and
    the YAML's entries no group of this layout asked for."""
    from .meta_compat import NCCL_OPTIONS as n
    asked = set(n["asked"])
    return {"options": n["options"], "unused": [k for k in n["configured"] if k not in asked]}


def run_seed(cfg) -> int:
    """The rehearsed run's seed: the first of the config's runs (seed_base, or one drawn from
    the system's entropy where the config leaves it unset, config.seeds)."""
    from ..config.seeds import run_seeds
    return run_seeds(cfg.run.seed_base, 1)[0]


def cpu_decision(cfg) -> dict:
    """Keyword arguments that give the project's setup and model code the CPU decision: the
    rehearsal runs a GPU config's code on the CPU (gloo-free fake groups, Megatron's local spec,
    the meta device), through the project's one device decision (`systems.device`)."""
    from ..systems.device import Device
    return {"device": Device(gpu=False, system=cfg.system.id, cuda_visible=False)}


def _transformer_config(cfg):
    """(config to build with, {field: [run value, rehearsal value]}, GPU-only fields absent)."""
    import dataclasses

    from ..model.builder import transformer_config
    run = transformer_config(cfg, **cpu_decision(cfg))
    changes = {k: [getattr(run, k), v] for k, v in CONFIG_CHANGES.items() if getattr(run, k) != v}
    built = dataclasses.replace(run, **CONFIG_CHANGES)
    gpu_only = {}
    if cfg.precision.compute in ("fp8", "nvfp4"):
        from ..precision.te_recipe import transformer_config_kwargs
        for k, v in transformer_config_kwargs(cfg).items():
            if v not in (None, False, 0) and getattr(built, k, None) != v:
                gpu_only[k] = v
    return built, changes, {k: repr(v) for k, v in gpu_only.items()}


def checkpoint_reads(chunks, cfg) -> tuple[dict, dict]:
    """The bytes this rank reads from the converted initial checkpoint, before and with the
    parallel load (checkpoint/read_plan.py), from the rank's sharded state dict: converted in
    whole layers (`--chunks-tp 1`), and in the chunks of the config's TP (the default)."""
    from megatron.core import parallel_state as ps

    from ..checkpoint.chunking import Chunking
    from ..checkpoint.read_plan import rank_read
    group = {"group_size": ps.get_data_parallel_world_size(with_context_parallel=True),
             "group_rank": ps.get_data_parallel_rank(with_context_parallel=True)}
    return (rank_read(chunks, cfg, **group).as_dict(),
            rank_read(chunks, cfg, chunking=Chunking.for_model(cfg.model, cfg.parallel.tp),
                      **group).as_dict())


def rehearse_rank(cfg, rank: int, alloc, clock: dict[str, float]) -> dict:
    """The phases of the module docstring; `clock` gets each phase's seconds as it ends."""
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        clock[name] = round(now - t, 3)
        t = now

    from . import meta_compat
    meta_compat.apply()
    import torch
    from megatron.core.optimizer import get_megatron_optimizer

    from ..model.builder import build_model, optimizer_config, wrap_for_training
    from ..parallel.setup import seed_model_parallel, setup_parallel
    from . import allocation, fake_world, measure
    d = cfg.derived
    lap("imports")
    host = allocation.host_of_rank(cfg, alloc, rank)
    fake_world.init_fake_world(rank, d.world_size)
    lap("process group")
    info = setup_parallel(cfg, fake_world.dist_env(rank, d.world_size, host,
                                                   d.system.gpus_per_node),
                          create_gloo_process_groups=False, **cpu_decision(cfg))
    groups, wrong = _groups(cfg, rank)
    if wrong:
        raise RuntimeError("; ".join(wrong))
    lap("setup_parallel")
    allocation.check(cfg, alloc, rank)
    lap("placement")
    seed_model_parallel(run_seed(cfg))
    tcfg, changes, gpu_only = _transformer_config(cfg)
    with torch.device("meta"):
        chunks = build_model(cfg, config=tcfg, **cpu_decision(cfg))
    lap("model")
    reads, reads_tp = checkpoint_reads(chunks, cfg)
    lap("checkpoint read")
    with torch.device("meta"):
        model = wrap_for_training(cfg, chunks)
    lap("ddp")
    with torch.device("meta"):
        # megatron-core 0.19.2 annotates model_chunks List[MegatronModule], which is invariant:
        # its DistributedDataParallel is a MegatronModule, and the function only reads the list
        opt = get_megatron_optimizer(optimizer_config(cfg), model,  # type: ignore[arg-type]
                                     use_gloo_process_groups=False)
        measure.init_optimizer_state(opt)
    lap("optimizer")
    return {"coords": {"tp": info.tp_rank, "cp": info.cp_rank, "pp": info.pp_rank,
                       "dp": info.dp_rank},
            "groups": groups, "layers": measure.layers_held(chunks),
            "bytes": {**measure.buffer_bytes(model), **measure.optimizer_bytes(opt),
                      "te_copies": measure.te_copy_bytes(chunks, cfg)},
            "params": measure.param_count(chunks), "config_changes": changes,
            "checkpoint_read": reads, "checkpoint_read_tp_chunks": reads_tp,
            "nccl": _nccl_summary(), "quantized_params": _quantized_params(cfg),
            "gpu_only_fields": gpu_only}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llama31_405b.rehearse.rank")
    ap.add_argument("config")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--allocation")
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args(argv)
    start = time.perf_counter()
    clock: dict[str, float] = {}
    out: dict = {"rank": args.rank, "ok": False, "phases": clock}
    loaded = False
    try:
        from ..config.overrides import load_with_sets
        from . import allocation
        cfg = load_with_sets(args.config, args.set)
        alloc = (allocation.read_allocation(args.allocation) if args.allocation
                 else allocation.synthetic(cfg))
        out["host"] = allocation.host_of_rank(cfg, alloc, args.rank)
        loaded = True
        out.update(rehearse_rank(cfg, args.rank, alloc, clock))
        out["ok"] = True
    except Exception as e:   # reported, with the phase it happened in, by the parent
        from ..parallel.placement import PlacementError
        out["phase"] = (next((p for p in PHASES if p not in clock), "report") if loaded
                        else "config")
        out["error"] = f"{type(e).__name__}: {e}"
        out["placement_failed"] = isinstance(e, PlacementError)
        out["traceback"] = traceback.format_exc()[-4000:]
    return write_result(args.out, out, start)


def write_result(path: str, result: dict, start: float) -> int:
    """A child process's result for the parent: its wall time and peak RSS added, written
    atomically as JSON; the exit status says whether it passed."""
    result["wall_s"] = round(time.perf_counter() - start, 3)
    result["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)
    return 0 if result["ok"] else 1


PHASES = ("imports", "process group", "setup_parallel", "placement", "model", "checkpoint read",
          "ddp", "optimizer")

if __name__ == "__main__":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""   # before torch: Megatron must see no CUDA here
    sys.exit(main())
