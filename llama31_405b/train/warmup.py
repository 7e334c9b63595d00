"""The warm-up before run_start and the in-place restore after it.

The warm-up (`run.warmup_iters` training iterations, each a full forward/backward with gradient
reduction and an optimizer step, then evaluation passes) runs on synthetic tokens
(train.batches.synthetic_microbatches): kernels, buffers, communicators, Adam state and CUDA
graphs exist before the clock starts, and nothing of the dataset is read. Afterwards the run
is put back exactly where it was, without moving any tensor (CUDA graphs captured during the
warm-up hold the addresses of parameters, gradient buffers, RNG states and static inputs):

- model weights: the initial checkpoint is read again into the same parameter tensors
  (checkpoint.format.load: Megatron's load, then `load_state_dict`, which copies; extra state is
  never read, so no Transformer Engine buffer is re-created); without a checkpoint (tests, the
  tiny pre-training) from a host copy taken before the warm-up;
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
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

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


def torch_optimizers(optimizer) -> list:
    """The torch optimizers inside a Megatron (chained) optimizer."""
    chained = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return [getattr(o, "optimizer", o) for o in chained]


# -- random streams -------------------------------------------------------------------------------
def _capture_rng(gpu: bool) -> dict:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
    states = get_cuda_rng_tracker().get_states()           # name -> tensor or Generator
    return {"py": random.getstate(), "np": np.random.get_state(), "cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if gpu else None, "tracker": states,
            "generators": {n: s.get_state() for n, s in states.items()
                           if isinstance(s, torch.Generator)}}


def _restore_rng(saved: dict) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
    random.setstate(saved["py"])
    np.random.set_state(saved["np"])
    torch.set_rng_state(saved["cpu"])
    if saved["cuda"] is not None:
        torch.cuda.set_rng_state(saved["cuda"])
    get_cuda_rng_tracker().set_states(dict(saved["tracker"]))
    for name, state in saved["generators"].items():
        saved["tracker"][name].set_state(state)     # the same Generator object, in place


# -- Transformer Engine recipe statistics ------------------------------------------------------
def _te_recipe_buffers(chunks) -> dict[tuple[int, str, str], torch.Tensor]:
    """(module index, fp8_meta key, buffer name) -> tensor, for every TE module's recipe state
    that keeps statistics (RecipeState._persistent_state_buffers)."""
    out = {}
    from ..model.builder import unwrap
    modules = [m for c in chunks for m in unwrap(c).modules()]
    for i, mod in enumerate(modules):
        meta = getattr(mod, "fp8_meta", None)
        if not isinstance(meta, dict):
            continue
        for key in ("scaling_fwd", "scaling_bwd"):
            state = meta.get(key)
            for name in getattr(type(state), "_persistent_state_buffers", ()) or ():
                out[(i, key, name)] = getattr(state, name)
    return out


@dataclass
class RestorePoint:
    gpu: bool
    params: list[torch.Tensor] | None
    main_params: list[list[torch.Tensor]]
    opt_state: list[dict[int, dict[str, Any]]]
    groups: list[list[dict[str, Any]]]
    rng: dict
    te_buffers: dict = field(default_factory=dict)

    @classmethod
    def capture(cls, chunks, optimizer, *, gpu: bool, weights_from_checkpoint: bool
                ) -> "RestorePoint":
        """Snapshot before the warm-up. Model weights are copied to the host only when they
        will not be read again from the initial checkpoint."""
        params = None
        if not weights_from_checkpoint:
            from ..precision.te_recipe import is_te_quantized
            plist = [p for c in chunks for p in c.parameters()]
            if any(is_te_quantized(p) for p in plist):
                raise RestoreError("warm-up without an initial checkpoint cannot restore "
                                   "quantized (fp8/fp4) parameters; load a checkpoint or set "
                                   "run.warmup_iters = 0")
            params = [_host(p) for p in plist]
        opts = torch_optimizers(optimizer)
        main = [[_host(p) for g in o.param_groups for p in g["params"]] for o in opts]
        state = []
        for o in opts:
            flat = [p for g in o.param_groups for p in g["params"]]
            state.append({i: {k: _host(v) if torch.is_tensor(v) else v for k, v in o.state[p].items()}
                          for i, p in enumerate(flat) if o.state.get(p)})
        groups = [[{k: (_host(v) if torch.is_tensor(v) else v) for k, v in g.items() if k != "params"}
                   for g in o.param_groups] for o in opts]
        te = {k: _host(v) for k, v in _te_recipe_buffers(chunks).items()}
        return cls(gpu=gpu, params=params, main_params=main, opt_state=state, groups=groups,
                   rng=_capture_rng(gpu), te_buffers=te)

    def restore(self, chunks, optimizer, *, reload_weights: Callable[[], Any] | None) -> None:
        """Put everything back in place (module docstring). `reload_weights` reads the initial
        checkpoint into the model's parameters; None: use the host copy."""
        with torch.no_grad():
            for c in chunks:
                c.zero_grad_buffer()
            optimizer.zero_grad()
            if reload_weights is not None:
                reload_weights()
            else:
                if self.params is None:
                    raise RestoreError("no weights to restore: the restore point expected a "
                                       "checkpoint reload")
                for p, saved in zip((p for c in chunks for p in c.parameters()), self.params,
                                    strict=True):
                    p.copy_(saved)
            for o, mains, state, groups in zip(torch_optimizers(optimizer), self.main_params,
                                               self.opt_state, self.groups, strict=True):
                flat = [p for g in o.param_groups for p in g["params"]]
                for p, saved in zip(flat, mains, strict=True):
                    p.copy_(saved)
                self._restore_state(o, flat, state)
                self._restore_groups(o, groups)
            self._restore_te(chunks)
        _restore_rng(self.rng)

    @staticmethod
    def _restore_state(o, flat, saved: dict[int, dict]) -> None:
        for i, p in enumerate(flat):
            now = o.state.get(p)
            if not now:
                continue
            before = saved.get(i)
            for k, v in now.items():
                if before is not None and k in before:
                    if torch.is_tensor(v):
                        v.copy_(before[k])
                    else:
                        now[k] = before[k]
                elif k in _ZERO_INIT_STATE:
                    if torch.is_tensor(v):
                        v.zero_()
                    else:
                        now[k] = type(v)(0)
                else:
                    raise RestoreError(f"optimizer state {k!r} created by the warm-up has no "
                                       "known initial value; cannot restore it in place")

    @staticmethod
    def _restore_groups(o, saved: list[dict]) -> None:
        for g, before in zip(o.param_groups, saved, strict=True):
            for k in [k for k in g if k != "params" and k not in before]:
                del g[k]                      # e.g. TE FusedAdam's group "step" (absent before)
            for k, v in before.items():
                if torch.is_tensor(g.get(k)):
                    g[k].copy_(v)
                else:
                    g[k] = v

    def _restore_te(self, chunks) -> None:
        for key, t in _te_recipe_buffers(chunks).items():
            if key in self.te_buffers:
                t.copy_(self.te_buffers[key])
            elif key[2] in _TE_FRESH:
                t.fill_(_TE_FRESH[key[2]])
            else:
                raise RestoreError(f"Transformer Engine recipe buffer {key[2]!r} created by the "
                                   "warm-up has no known initial value")
