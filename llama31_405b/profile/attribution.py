"""What each trace event is: compute of a category (GEMMs by role, attention core, the rest),
communication of a process group, or host time.

CPU (gloo) traces. Checked with torch 2.13 (docs/profile.md): a gloo collective runs on one of
its process group's own worker threads ("pt_gloo_runloop"), where it leaves a `gloo:<op>` event
with shapes but no group; the caller's `c10d::<op>` event covers only the enqueue. The driver
(profile/capture.py) records which OS threads each group's creation started, so a worker-thread
event belongs to the group that owns its thread. Point-to-point `gloo:send` / `gloo:recv` run on
the caller's thread (the recv's event lasts until the data arrived): megatron-core 0.19.2 sends
only between pipeline stages (pipeline_parallel/p2p_communication.py), so they belong to the
pipeline group.

GPU (NCCL) traces. torch 2.13 records each NCCL collective as a `record_param_comms` host event
whose args carry "Collective name", "Process Group Name", "Process Group Description" and
"Process Group Ranks" (torch/csrc/profiler/util.cpp, saveNcclMeta); its kernels
(`ncclDevKernel_*`, NCCL 2.19+ naming; `ncclKernel_*` before) share the host op's
"External id". Kernels whose args carry the group themselves are taken as they are.

Compute roles. The driver wraps the model's modules in `role:<name>` annotations (forward); an
autograd backward node runs under `autograd::engine::evaluate_function: <Node>` with the
"Sequence number" of the forward op that created it, so a backward op takes the role of the
forward op with that number. GEMMs are aten's matrix products on CPU, and on GPU the kernels of
cuBLAS/cuBLASLt/CUTLASS (names with gemm, nvjet, xmma, cutlass).
"""
from __future__ import annotations

import re

GROUP_ROLES = (
    ("TENSOR_MODEL_PARALLEL_GROUP", "TP"),
    ("CONTEXT_PARALLEL_GROUP", "CP"),
    ("PIPELINE_MODEL_PARALLEL_GROUP", "PP"),
    ("INTRA_PARTIAL_DATA_PARALLEL", "DP"),
    ("DATA_PARALLEL_GROUP", "DP"),
)
"""megatron-core 0.19.2 group_desc (parallel_state.initialize_model_parallel) -> parallel
dimension; every other group (default_pg: the world, MODEL_PARALLEL_GROUP, EMBEDDING_GROUP, ...)
is reported as "other" under its own name."""
COMM_ROLES = ("TP", "CP", "PP", "DP", "other")


def group_role(desc: str) -> str:
    if desc.startswith("TENSOR_AND_") or desc.startswith("EXPERT_"):
        return "other"
    for prefix, role in GROUP_ROLES:
        if desc.startswith(prefix):
            return role
    return "other"


# -- compute categories ------------------------------------------------------------------------
GEMM_ROLES = ("qkv", "proj", "ffn_up", "ffn_down", "lm_head")
COMPUTE_CATEGORIES = (*(f"gemm_{r}" for r in GEMM_ROLES), "gemm_other", "attention", "norm",
                      "activation", "attention_other", "embedding", "loss", "optimizer", "other")
"""gemm_<role>: the GEMMs of a module role; attention: the attention core (scores, softmax,
weighted sum); attention_other: the rest of self-attention outside its GEMMs and core (RoPE,
reshapes); activation: the MLP outside its GEMMs (SwiGLU); loss: the cross-entropy after the LM
head; other: everything else (elementwise, autograd bookkeeping)."""

MODULE_ROLES = (
    # (suffix of the module's qualified name in a megatron GPTModel, role); first match wins
    (".self_attention.linear_qkv", "qkv"),
    (".self_attention.core_attention", "attention"),
    (".self_attention.linear_proj", "proj"),
    (".self_attention", "attention_other"),
    (".mlp.linear_fc1", "ffn_up"),
    (".mlp.linear_fc2", "ffn_down"),
    (".mlp", "activation"),
    ("input_layernorm", "norm"),
    ("pre_mlp_layernorm", "norm"),
    ("final_layernorm", "norm"),
    ("output_layer", "lm_head"),
    ("embedding", "embedding"),
)
ROLE_PREFIX = "role:"
OPTIMIZER_ANNOTATION = "profile:optimizer"
LOSS_ANNOTATION = "profile:loss"
KERNEL_PREFIX = "kernel::"
"""An annotation around a C kernel that aten does not dispatch (the emulated NVFP4 quantisation's,
precision/native.py, called through ctypes): its self time is compute, where the self time of a
Python-level op (the autograd Function that calls it) is host time. Without it the profile
counted the kernel's calls as host time: 9-14 ms a step per rank of the proof's tiny_cpu_gb200
layout (one profile, 2026-12-07 07:59 UTC), where the emulated linears' autograd Functions had
held 19-24 ms a step of their own time (run T0635Z's profile of it;
docs/planner_proof/quantisation/kernel_attribution_2026-12-07T0759Z/)."""

_GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm",
             "aten::mv", "aten::addmv", "aten::_int_mm"}
_GEMM_KERNEL = re.compile(r"gemm|nvjet|xmma|cutlass|cublas", re.IGNORECASE)
_ATTN_KERNEL = re.compile(r"flash|fmha|sdpa|attn|attention", re.IGNORECASE)
_NCCL_KERNEL = re.compile(r"^nccl(Dev)?Kernel")
_HOST_COMM = ("c10d::", "gloo:", "nccl:", "record_param_comms")


def module_role(qualified_name: str) -> str | None:
    for suffix, role in MODULE_ROLES:
        if qualified_name.endswith(suffix) or qualified_name == suffix.lstrip("."):
            return role
    return None


def is_gemm_op(name: str) -> bool:
    return name in _GEMM_OPS


def is_gemm_kernel(name: str) -> bool:
    return bool(_GEMM_KERNEL.search(name)) and not is_nccl_kernel(name)


def is_attention_kernel(name: str) -> bool:
    return bool(_ATTN_KERNEL.search(name)) and not is_gemm_kernel(name)


def is_nccl_kernel(name: str) -> bool:
    return bool(_NCCL_KERNEL.match(name))


def is_host_comm(name: str) -> bool:
    return name.startswith(_HOST_COMM)


def category(gemm: bool, role: str | None, region: str | None) -> str:
    """The compute category of an op (or kernel) from what it is and where it ran."""
    if gemm:
        if role == "attention":   # the core's score and weighted-sum products
            return "attention"
        if role in GEMM_ROLES:
            return f"gemm_{role}"
        return "gemm_other"
    if region == "optimizer":
        return "optimizer"
    if role in ("attention", "attention_other", "norm", "activation", "embedding"):
        return role
    if role == "lm_head" or region == "loss":
        return "loss"
    return "other"

