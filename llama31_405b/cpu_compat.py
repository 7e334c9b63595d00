"""What megatron-core needs to run on the CPU (tiny runs, tests), in one place.

`apply(device)` is called before megatron-core is used, with the decision of
`llama31_405b.systems.device.decide`. On a GPU decision it does nothing: Megatron runs unpatched.
On a CPU decision it redirects Megatron's unconditional CUDA calls to the CPU, also on a machine
whose GPUs are visible (a `cpu` config on a GPU node runs as configured): there it also makes
`torch.cuda.is_available()` answer False, so that Megatron's own checks take their CPU branches.
Each patch says why it is needed (megatron-core 0.19.2). Idempotent.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_applied = False
_mode = None   # the _CudaToCpu instance on the torch-function stack


class _NoStream:
    """Stand-in for a CUDA stream/event: everything on CPU is already in program order."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_event(self, *args, **kwargs):
        pass

    def wait_stream(self, *args, **kwargs):
        pass

    def record_event(self, *args, **kwargs):
        return _NoStream()

    def record(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _is_cuda(device) -> bool:
    return device is not None and str(device).startswith("cuda")


class _CudaToCpu(TorchFunctionMode):
    """Rewrites CUDA placements to the CPU for every torch call.

    Megatron's schedules, DDP buffers, distributed optimizer and grad clipping create tensors
    with device="cuda", call `.cuda()`/`.to("cuda")`, pin memory, and assert
    `tensor.type() == "torch.cuda.FloatTensor"`; a function mode catches all of them without
    touching Megatron's source."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda or func is torch.Tensor.pin_memory:
            return args[0]  # already in host memory
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # the optimizer asserts CUDA tensor type names; report the CUDA name of the CPU type
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False  # pinning needs a CUDA driver
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def apply(device=None) -> bool:
    """Patch torch for megatron-core on the CPU unless `device` (a systems.device.Device) is a
    GPU; without a device, patch only where no CUDA device is visible. Returns True when the
    patches are active."""
    global _applied
    if _applied:
        return True
    from .systems.device import cuda_visible
    # torch.cuda, typed Any: the stand-ins below replace its functions and classes on purpose,
    # with CPU answers whose types differ from CUDA's (a "cpu" device, _NoStream)
    cuda: Any = torch.cuda
    visible = cuda_visible()
    if (device.gpu if device is not None else visible):
        return False
    if visible:
        # a CPU decision on a machine with GPUs: Megatron and torch.distributed must not pick
        # the visible devices (megatron.core.utils, dist_checkpointing strategies ask this)
        cuda.is_available = lambda: False
    # ~200 call sites use torch.cuda.current_device() as a device argument.
    cuda.current_device = lambda: "cpu"
    # parallel_state, DDP and the schedules synchronize unconditionally.
    cuda.synchronize = lambda *a, **k: None
    # DDP/param buffers wait on the current stream and create a communication stream (0.19).
    cuda.current_stream = lambda *a, **k: _NoStream()
    cuda.default_stream = lambda *a, **k: _NoStream()
    cuda.Stream = _NoStream
    cuda.Event = _NoStream
    cuda.stream = lambda *a, **k: _NoStream()
    # The tensor-parallel RNG tracker saves/restores CUDA generator states: back it with the
    # CPU generator, so dropout inside TP regions stays seeded and reproducible.
    cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    cuda.random.get_rng_state = cuda.get_rng_state
    cuda.manual_seed = lambda seed: torch.manual_seed(seed)
    import megatron.core.tensor_parallel.random as mrandom
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    # Memory statistics are queried for logging; a CPU run has no device memory to report.
    cuda.max_memory_allocated = lambda *a, **k: 0
    cuda.memory_allocated = lambda *a, **k: 0
    # The causal mask of the unfused softmax (megatron-core 0.19.2 fused_softmax imports
    # transformer.utils.get_default_causal_mask, which builds it with device="cuda" on every
    # attention call): the same mask built on the CPU, once per sequence length, so that the
    # model's forward runs without the function mode below (without_cuda_redirect).
    import megatron.core.fusions.fused_softmax as fused_softmax
    fused_softmax.get_default_causal_mask = _causal_mask
    # Redirect device="cuda" literals and .cuda() calls (see _CudaToCpu). Stays active for the
    # lifetime of the process, like the patches above.
    global _mode
    _mode = _CudaToCpu()
    _mode.__enter__()
    # gloo runs a group's asynchronous collectives on one worker thread (gloo_workers)
    from . import gloo_workers
    gloo_workers.apply()
    _applied = True
    return True


@functools.lru_cache(maxsize=8)
def _causal_mask(sq: int) -> torch.Tensor:
    """megatron-core 0.19.2 transformer.utils.get_default_causal_mask on the CPU (read-only)."""
    return torch.triu(torch.ones(sq, sq), diagonal=1).bool()


def without_cuda_redirect(fn):
    """`fn` run with the _CudaToCpu function mode off, where `fn` needs no redirect.

    A Python torch-function mode runs a Python call for every torch operation: ~3,500 per tiny
    training step, which doubles the dispatch cost of each small op (measured: bench/tiny_train.py,
    docs/training.md). The model's forward (with the causal mask above) and torch's own optimizer
    step issue no CUDA call on the CPU, so they run without it; everything else keeps it. Where the
    mode is not on top of the stack (a GPU decision, or another mode pushed above it), `fn` runs
    unchanged."""
    from torch.overrides import _get_current_function_mode_stack, _pop_mode_temporarily

    @functools.wraps(fn)
    def run(*args, **kwargs):
        stack = _get_current_function_mode_stack()
        if _mode is None or not stack or stack[-1] is not _mode:
            return fn(*args, **kwargs)
        with _pop_mode_temporarily():
            return fn(*args, **kwargs)
    return run


def _logits_max(vocab_parallel_logits: torch.Tensor):
    """megatron-core 0.19.2 `VocabParallelCrossEntropy.calculate_logits_max` with `torch.amax`
    for `torch.max(x, dim=-1)[0]`: the same maxima bit for bit (a maximum is exact; both propagate
    NaN), without the indices nobody reads, whose search makes torch.max(dim) several times
    slower on the CPU (the tiny logits [256, 2, 4096], one thread: the cross entropy's forward
    6.6 ms with torch.max, 4.1 ms with torch.amax; docs/training.md)."""
    vocab_parallel_logits = vocab_parallel_logits.float()
    return vocab_parallel_logits, torch.amax(vocab_parallel_logits, dim=-1)


def _mask_scores(attention_scores: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """megatron-core 0.19.2 `transformer.utils.attention_mask_func` (the unfused softmax's mask:
    -10000.0 where the mask is set) as one out-of-place `torch.where`: the same scores bit for
    bit, in any dtype. Megatron's version fills in place a view of the attention-score matmul's
    output, so autograd rewrites that output's history as a CopySlices node, whose backward
    clones the [b, heads, s, s] gradient and copies it twice more before the mask's own
    backward; and `masked_fill_` with a broadcast [s, s] mask is itself slower on the CPU than
    `where` (the tiny scores [2, 4, 256, 256], one thread: 0.82 ms in place, 0.48 ms with
    `where`; docs/training.md)."""
    return torch.where(attention_mask, -10000.0, attention_scores)


def _use_mask_scores(chunk) -> bool:
    """Every unfused masked softmax of `chunk` (Megatron's local attention) masks with
    `_mask_scores`; True when one was switched."""
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    from megatron.core.transformer.utils import attention_mask_func
    switched = False
    for m in chunk.modules():
        if isinstance(m, FusedScaleMaskSoftmax) and m.mask_func is attention_mask_func:
            m.mask_func = _mask_scores
            switched = True
    return switched


def fast_paths(model_chunks, optimizer) -> int:
    """On the CPU (after apply): the forward of every model chunk and the step of every torch
    optimizer inside Megatron's optimizer run without the function mode (without_cuda_redirect);
    patched on the instances, so state dicts and checkpoints are unchanged. The unfused
    attention of every chunk masks its scores with one out-of-place `where` (`_mask_scores`, set
    on each softmax module). And the vocab-parallel cross entropy (unfused and fused: both call
    the class's staticmethod) takes its logits maximum with `_logits_max`, for the process.
    Returns the number of callables switched (the mask counted once per chunk; 0 where the mode
    is not active: GPU)."""
    if _mode is None:
        return 0
    n = 0
    from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy as vpce
    if vpce.__dict__["calculate_logits_max"].__func__ is not _logits_max:
        # patched on purpose (above): the checker refuses assigning to a method
        vpce.calculate_logits_max = staticmethod(_logits_max)  # type: ignore[method-assign]
        n += 1
    for chunk in model_chunks:
        inner = chunk
        while hasattr(inner, "module"):       # DDP / Float16Module wrappers
            inner = inner.module
        if not getattr(inner, "_fast_forward", False):
            inner.forward = without_cuda_redirect(inner.forward)
            inner._fast_forward = True
            n += 1
        n += _use_mask_scores(inner)
    for opt in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner = getattr(opt, "optimizer", None)
        if isinstance(inner, torch.optim.Optimizer) and not getattr(inner, "_fast_step", False):
            # patched on the instance on purpose (above), marked so it is patched once
            inner.step = without_cuda_redirect(inner.step)  # type: ignore[method-assign]
            inner._fast_step = True  # type: ignore[attr-defined]
            n += 1
    return n
