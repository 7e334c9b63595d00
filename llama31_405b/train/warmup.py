"""The warm-up before run_start and the in-place restore after it.

The warm-up (`run.warmup_iters` training iterations, each a full forward/backward with gradient
reduction and an optimizer step, then evaluation passes) runs on synthetic tokens
(train.batches.synthetic_microbatches): kernels, buffers, communicators, Adam state and CUDA
graphs exist before the clock starts, and nothing of the dataset is read. Afterwards the run
is put back exactly where it was, without moving any tensor (CUDA graphs captured during the
warm-up hold the addresses of parameters, gradient buffers, RNG states and static inputs):

- model weights: put back from the FP32 master weights the restore point keeps on the host
  (the optimizer's parameter groups: the distributed optimizer's shards, Float16Optimizer's
  full FP32 copies, or the parameters themselves for FP32 parameters without a separate
  master), copied into the model's parameters by the optimizer's own
  `_copy_main_params_to_model_params` and completed by a synchronous parameter all-gather
  (`start_param_sync(force_sync=True)` on every chunk; megatron-core 0.19.2
  DistributedDataParallel) where the distributed optimizer shards them. The checkpoint is not
  read again. This is bit-identical: the master weights were made from the loaded BF16 (or
  FP32) values by an exact widening, and narrowing them back is exact. Quantized (fp8/fp4)
  parameters are re-cast from the checkpoint's high-precision values kept on the host
  (`quantized_values`, taken right after the load), after the recipe statistics below are
  back, exactly as the load cast them; without a checkpoint they are refused;
- optimizer: FP32 master weights / distributed-optimizer shards copied back from a host copy;
  Adam moments and step counters zeroed in place (equal to the state Adam creates at its first
  step: zero moments, step 0) or, where state existed before, copied back; parameter-group
  entries (learning rate, TE FusedAdam's group step) restored, entries the warm-up added removed;
- gradients: DDP gradient buffers zeroed in place, optimizer gradients dropped;
- random streams: Python, NumPy, torch CPU, the CUDA default generator and every state of
  Megatron's model-parallel RNG tracker; graph-safe generator states (torch.Generator objects,
  which the graphs registered) are set in place;
- FP8/FP4 statistics: every Transformer Engine recipe state with persistent buffers
  (delayed scaling: scale, amax history) copied back, or reset to its initial value (scale 1,
  amax history 0) where the warm-up created it; NVFP4 and current-scaling recipes keep none;
- data position: none to restore. The sample order is a function of the step alone
  (train.batches) and the timed run's loader starts at step 0 after run_start.

`RestorePoint.capture` is taken after the optimizer exists and before the first warm-up
iteration; `restore` runs after the last one (and after a per-layer graph capture).
Host memory: the FP32 master shards and Adam state of this rank (as before), plus, with
quantized parameters only, their high-precision checkpoint values.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np
import torch

if TYPE_CHECKING:   # megatron.core is imported after the TE environment check (train.loop)
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup
    from megatron.core.optimizer import MegatronOptimizer

WARMUP_SEED = 20250715
"""Seed of the synthetic warm-up tokens (its own generator; the run's streams are untouched)."""

# optimizer state entries whose initial value is zero (torch AdamW, TE FusedAdam, Apex FusedAdam)
_ZERO_INIT_STATE = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step")
# Transformer Engine recipe-state buffers and their initial values (TE 2.20.2
# transformer_engine.pytorch.quantization DelayedScalingRecipeState.__init__)
_TE_FRESH = {"scale": 1.0, "amax_history": 0.0}


class RestoreError(RuntimeError):
    """The warm-up changed state this module does not know how to put back."""


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def _hosted(entries: Mapping[str, object]) -> dict[str, object]:
    """A copy of optimizer state or group `entries`, tensors copied to the host."""
    return {k: _host(v) if torch.is_tensor(v) else v for k, v in entries.items()}


def torch_optimizers(optimizer: MegatronOptimizer) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside a Megatron (chained) optimizer."""
    chained = megatron_optimizers(optimizer)
    # a Megatron optimizer's `optimizer`; a plain torch optimizer (tests) is its own
    return [cast(torch.optim.Optimizer, getattr(o, "optimizer", o)) for o in chained]


def _flat_params(o: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters of `o`, group after group (torch types a group's entries Any)."""
    flat: list[torch.Tensor] = [p for g in o.param_groups for p in g["params"]]
    return flat


# -- random streams -------------------------------------------------------------------------------
class RngSnapshot(TypedDict):
    """Every random stream the warm-up draws from (`_capture_rng`)."""
    py: tuple[Any, ...]          # random.getstate(): typeshed's type
    np: dict[str, Any] | tuple[str, np.ndarray, int, int, float]   # np.random.get_state()'s
    cpu: torch.Tensor
    cuda: torch.Tensor | None
    tracker: dict[str, torch.Tensor | torch.Generator]
    """megatron-core's CudaRNGStatesTracker.get_states(): a state tensor, or the Generator
    itself where the tracker is graph-safe."""
    generators: dict[str, torch.Tensor]


def _capture_rng(gpu: bool) -> RngSnapshot:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
    # name -> tensor or Generator
    states: dict[str, torch.Tensor | torch.Generator] = get_cuda_rng_tracker().get_states()
    return {"py": random.getstate(), "np": np.random.get_state(), "cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if gpu else None, "tracker": states,
            "generators": {n: s.get_state() for n, s in states.items()
                           if isinstance(s, torch.Generator)}}


def _restore_rng(saved: RngSnapshot) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
    random.setstate(saved["py"])
    np.random.set_state(saved["np"])
    torch.set_rng_state(saved["cpu"])
    if saved["cuda"] is not None:
        torch.cuda.set_rng_state(saved["cuda"])
    get_cuda_rng_tracker().set_states(dict(saved["tracker"]))
    for name, state in saved["generators"].items():
        gen = saved["tracker"][name]
        assert isinstance(gen, torch.Generator)     # `generators` holds the Generators' names
        gen.set_state(state)                         # the same Generator object, in place


# -- Transformer Engine recipe statistics ------------------------------------------------------
def _te_recipe_buffers(chunks: Sequence[torch.nn.Module]
                       ) -> dict[tuple[int, str, str], torch.Tensor]:
    """(module index, fp8_meta key, buffer name) -> tensor, for every TE module's recipe state
    that keeps statistics (RecipeState._persistent_state_buffers)."""
    out: dict[tuple[int, str, str], torch.Tensor] = {}
    from ..model.builder import unwrap
    modules = [m for c in chunks for m in unwrap(c).modules()]
    for i, mod in enumerate(modules):
        # TE 2.20.2 TransformerEngineBaseModule.fp8_meta: an untyped dict (recipe states by key)
        meta: object = getattr(mod, "fp8_meta", None)
        if not isinstance(meta, dict):
            continue
        for key in ("scaling_fwd", "scaling_bwd"):
            state: object = meta.get(key)
            names: tuple[str, ...] = getattr(type(state), "_persistent_state_buffers", ()) or ()
            for name in names:
                out[(i, key, name)] = getattr(state, name)
    return out


def quantized_values(chunks: Sequence[torch.nn.Module]
                     ) -> dict[torch.nn.Parameter, torch.Tensor]:
    """{parameter: host tensor} of the checkpoint's high-precision values of every quantized
    (fp8/fp4) parameter, as `checkpoint.format.load` leaves them
    (`precision.te_recipe.keep_checkpoint_master_values`: `_high_precision_init_val`). Taken right
    after the load: megatron-core's DistributedOptimizer clears them when it builds its master
    weights. Empty for BF16/FP32 parameters."""
    from ..precision.te_recipe import is_te_quantized
    out: dict[torch.nn.Parameter, torch.Tensor] = {}
    for c in chunks:
        for p in c.parameters():
            if not is_te_quantized(p):
                continue
            # TE's attribute on its quantized tensors (no torch.nn.Parameter has it)
            value: torch.Tensor | None = getattr(p, "_high_precision_init_val", None)
            if value is not None:
                out[p] = value
    return out


def megatron_optimizers(optimizer: MegatronOptimizer) -> list[MegatronOptimizer]:
    """The Megatron optimizers inside a (chained) Megatron optimizer."""
    # megatron-core 0.19.2 ChainedOptimizer.chained_optimizers; any other is its own
    chained: list[MegatronOptimizer] = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return list(chained)


@dataclass
class RestorePoint:
    gpu: bool
    main_params: list[list[torch.Tensor]]
    opt_state: list[dict[int, dict[str, object]]]
    """Per torch optimizer: parameter index -> its state (tensors on the host, or scalars)."""
    groups: list[list[dict[str, object]]]
    """Per torch optimizer: its parameter groups' entries but "params" (tensors on the host)."""
    rng: RngSnapshot
    te_buffers: dict[tuple[int, str, str], torch.Tensor] = field(default_factory=dict)
    quantized: dict[torch.nn.Parameter, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def capture(cls, chunks: Sequence[DistributedDataParallel], optimizer: MegatronOptimizer, *,
                gpu: bool, quantized: dict[torch.nn.Parameter, torch.Tensor] | None = None
                ) -> RestorePoint:
        """Snapshot before the warm-up. `quantized`: `quantized_values(chunks)` taken after the
        checkpoint load (required when the parameters are fp8/fp4)."""
        from ..precision.te_recipe import is_te_quantized
        quantized = dict(quantized or {})
        lacking = [p for c in chunks for p in c.parameters()
                   if is_te_quantized(p) and p not in quantized]
        if lacking:
            raise RestoreError("the warm-up cannot restore quantized (fp8/fp4) parameters "
                               "without their checkpoint values; load an initial checkpoint or "
                               "set run.warmup_iters = 0")
        opts = torch_optimizers(optimizer)
        main = [[_host(p) for p in _flat_params(o)] for o in opts]
        state: list[dict[int, dict[str, object]]] = []
        for o in opts:
            flat = _flat_params(o)
            state.append({i: _hosted(o.state[p]) for i, p in enumerate(flat) if o.state.get(p)})
        groups = [[_hosted({k: v for k, v in g.items() if k != "params"}) for g in o.param_groups]
                  for o in opts]
        te = {k: _host(v) for k, v in _te_recipe_buffers(chunks).items()}
        return cls(gpu=gpu, main_params=main, opt_state=state, groups=groups,
                   rng=_capture_rng(gpu), te_buffers=te, quantized=quantized)

    def restore(self, chunks: Sequence[DistributedDataParallel], optimizer: MegatronOptimizer
                ) -> None:
        """Put everything back in place (module docstring)."""
        with torch.no_grad():
            for c in chunks:
                c.zero_grad_buffer()
            optimizer.zero_grad()
            for o, mains, state, groups in zip(torch_optimizers(optimizer), self.main_params,
                                               self.opt_state, self.groups, strict=True):
                flat = _flat_params(o)
                for p, saved in zip(flat, mains, strict=True):
                    p.copy_(saved)
                self._restore_state(o, flat, state)
                self._restore_groups(o, groups)
            self._restore_te(chunks)
            self._restore_weights(chunks, optimizer)
        _restore_rng(self.rng)

    def _restore_weights(self, chunks: Sequence[DistributedDataParallel],
                         optimizer: MegatronOptimizer) -> None:
        """Model parameters from the restored master weights (module docstring)."""
        for o in megatron_optimizers(optimizer):
            # MixedPrecisionOptimizer's (Float16Optimizer, DistributedOptimizer)
            copy: Callable[[], None] | None = getattr(o, "_copy_main_params_to_model_params", None)
            if copy is not None:          # FP32Optimizer / plain torch: the masters are the params
                copy()
        for c in chunks:
            ddp: DistributedDataParallelConfig | None = getattr(c, "ddp_config", None)
            if ddp is not None and (ddp.use_distributed_optimizer or ddp.overlap_param_gather):
                # an all-gather still in flight would make force_sync wait for it and return
                # without gathering: finish it first, then gather the restored shards
                bucket_groups: list[_ParamAndGradBucketGroup] = getattr(c, "bucket_groups", [])
                for bucket_group in bucket_groups:
                    # megatron-core 0.19.2 initialises the handle to None unannotated: read as
                    # `object`, so that mypy does not take this branch for dead and checks it
                    handle: object = bucket_group.param_gather_handle
                    if handle is not None:
                        bucket_group.start_param_sync(force_sync=True)
                c.start_param_sync(force_sync=True)
        for p, value in self.quantized.items():
            p.copy_(value)                # the cast the checkpoint load did (load_state_dict)

    @staticmethod
    def _restore_state(o: torch.optim.Optimizer, flat: list[torch.Tensor],
                       saved: dict[int, dict[str, object]]) -> None:
        for i, p in enumerate(flat):
            now: dict[str, object] | None = o.state.get(p)   # torch types the state Any
            if not now:
                continue
            before = saved.get(i)
            for k, v in now.items():
                if before is not None and k in before:
                    if torch.is_tensor(v):   # then saved from a tensor, on the host
                        v.copy_(cast(torch.Tensor, before[k]))
                    else:
                        now[k] = before[k]
                elif k in _ZERO_INIT_STATE:
                    if torch.is_tensor(v):
                        v.zero_()
                    else:   # a number (a step count): its type's zero
                        now[k] = cast("type[float]", type(v))(0)
                else:
                    raise RestoreError(f"optimizer state {k!r} created by the warm-up has no "
                                       "known initial value; cannot restore it in place")

    @staticmethod
    def _restore_groups(o: torch.optim.Optimizer, saved: list[dict[str, object]]) -> None:
        for g, before in zip(o.param_groups, saved, strict=True):
            for k in [k for k in g if k != "params" and k not in before]:
                del g[k]                      # e.g. TE FusedAdam's group "step" (absent before)
            for k, v in before.items():
                if torch.is_tensor(g.get(k)):
                    g[k].copy_(v)
                else:
                    g[k] = v

    def _restore_te(self, chunks: Sequence[DistributedDataParallel]) -> None:
        for key, t in _te_recipe_buffers(chunks).items():
            if key in self.te_buffers:
                t.copy_(self.te_buffers[key])
            elif key[2] in _TE_FRESH:
                t.fill_(_TE_FRESH[key[2]])
            else:
                raise RestoreError(f"Transformer Engine recipe buffer {key[2]!r} created by the "
                                   "warm-up has no known initial value")
