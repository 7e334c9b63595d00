"""What megatron-core needs to build a rank's model, DDP buffers and distributed optimizer on the
meta device (shapes and dtypes, no storage), for the rehearsal only. Beside `cpu_compat` in
spirit: each patch says why it is needed (megatron-core 0.19.2), and the process that applies it
does nothing else (the rehearsal runs every rank in a process of its own: rehearse/forks.py).

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
4. The fake backend takes no NCCL options, but `initialize_model_parallel` hands each group
   the `ProcessGroupNCCL.Options` that `parallel_state.get_nccl_options` derives from the
   config's NCCL communicator YAML. The wrapper lets Megatron derive them (its own checks run),
   records them in NCCL_OPTIONS for the report, and creates the group without them.
The model is then built under `torch.device("meta")` (see rehearse/rank.py), so CPU placements
(`use_cpu_initialization`) stay free of storage too.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_CUDA_TYPE = {torch.float32: "torch.cuda.FloatTensor", torch.float16: "torch.cuda.HalfTensor",
              torch.bfloat16: "torch.cuda.BFloat16Tensor"}
_applied = False
NCCL_OPTIONS: dict = {"asked": [], "configured": [], "options": {}}
"""Group names Megatron asked options for, the names the communicator YAML configures, and the
options Megatron derived for each configured group (patch 4)."""


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
    # on purpose: the meta device stands in for CUDA's device index (as cpu_compat's "cpu")
    torch.cuda.current_device = lambda: "meta"  # type: ignore[assignment,return-value]
    _CudaToMeta().__enter__()   # on top of cpu_compat's mode: it sees CUDA placements first
    _record_nccl_options()
    _applied = True


def _record_nccl_options() -> None:
    """Patch 4 of the module docstring."""
    from megatron.core import parallel_state as ps
    derive = ps.get_nccl_options

    def get_nccl_options(pg_name, nccl_comm_cfgs):
        opts = derive(pg_name, nccl_comm_cfgs)
        NCCL_OPTIONS["asked"].append(pg_name)
        NCCL_OPTIONS["configured"] = sorted(nccl_comm_cfgs or {})
        if opts is not None:
            c = opts.config
            NCCL_OPTIONS["options"][pg_name] = {
                "cga_cluster_size": c.cga_cluster_size, "min_ctas": c.min_ctas,
                "max_ctas": c.max_ctas, "high_priority": opts.is_high_priority_stream}
        return None

    ps.get_nccl_options = get_nccl_options
