"""What megatron-core needs to build a rank's model, DDP buffers and distributed optimizer on the
meta device (shapes and dtypes, no storage), for the rehearsal only. Beside `cpu_compat` in
spirit: each patch says why it is needed (megatron-core 0.19.2), and the process that applies it
does nothing else (the rehearsal runs every rank in a fresh process).

`apply()` first applies `cpu_compat` (CUDA streams, events, RNG states and synchronisation
answered on the CPU), then:
1. `torch.cuda.current_device()` answers "meta": Megatron allocates parameters
   (`_initialize_affine_weight_gpu`), DDP's contiguous parameter and gradient buffers
   (`_ParamAndGradBuffer`) and the optimizer's FP32 shards at that device.
2. A torch function mode sends every other CUDA placement (device="cuda", `.cuda()`,
   `.to("cuda")`) to the meta device as well.
3. The distributed optimizer sorts parameters by `tensor.type()` and accepts only the names
   'torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor' and 'torch.cuda.FloatTensor'
   (`DistributedOptimizer._build_model_and_main_param_groups`); a meta tensor reports
   'torch.meta.BFloat16Tensor' and would be rejected with a TypeError. The mode answers the CUDA
   name of the meta tensor's dtype instead.
The model is then built under `torch.device("meta")` (see rehearse/rank.py), so CPU placements
(`use_cpu_initialization`) stay free of storage too.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_CUDA_TYPE = {torch.float32: "torch.cuda.FloatTensor", torch.float16: "torch.cuda.HalfTensor",
              torch.bfloat16: "torch.cuda.BFloat16Tensor"}
_applied = False


def _is_cuda(device) -> bool:
    return device is not None and str(device).startswith("cuda")


class _CudaToMeta(TorchFunctionMode):
    """Patches 2 and 3 of the module docstring, for every torch call of the process."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.type and len(args) == 1 and not kwargs and args[0].is_meta:
            return _CUDA_TYPE.get(args[0].dtype, f"torch.cuda.meta.{args[0].dtype}")
        if func is torch.Tensor.cuda:
            return args[0]
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "meta"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "meta", *args[2:])
        return func(*args, **kwargs)


def apply() -> None:
    """Patch this process for meta-device Megatron (idempotent). Call before megatron-core is
    used; the process must not have CUDA (the rehearsal hides it: CUDA_VISIBLE_DEVICES="")."""
    global _applied
    if _applied:
        return
    if torch.cuda.is_available():
        raise RuntimeError("the rehearsal's meta-device patches need a process without CUDA; "
                           "run it with CUDA_VISIBLE_DEVICES= (the rehearse command does)")
    from .. import cpu_compat
    cpu_compat.apply()
    torch.cuda.current_device = lambda: "meta"
    _CudaToMeta().__enter__()   # on top of cpu_compat's mode: it sees CUDA placements first
    _applied = True
