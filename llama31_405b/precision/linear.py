"""An NVFP4 linear layer Y = X W^T that quantizes its GEMM operands as TE's NVFP4BlockScaling does.

Per GEMM (T tokens, K input features, N output features; X [T, K], W [N, K], dY [T, N]):

    Fprop  Y  = X  W^T    X rowwise 1x16 along K, RN          W 16x16 tiles (2d) or 1x16 along K, RN
    Dgrad  dX = dY W      dY rowwise 1x16 along N, SR         W columnwise: 1x16 along N (same 2D
                                                              tiles when 2d), RN
    Wgrad  dW = dY^T X    dY columnwise 1x16 along T,         X columnwise 1x16 along T, RHT, RN
                          RHT + SR

Every operand is quantized from the high-precision tensor (never from another quantized copy);
RHT, SR and 2D tiles are each switchable (NVFP4Recipe). The GEMMs run on the dequantized FP32
values (emulation: the products of E2M1 x E4M3 values are exact in FP32, only the accumulation
order differs from the tensor cores); master weights and gradients stay FP32. The Hadamard
matrix is orthogonal, so RHT cancels in the Wgrad product: (dY^T M)(X^T M)^T = dY^T X.

Tensor parallelism and the global amax (see tp_amax_groups): TE MAX-all-reduces the amax over the
TP group exactly for the operands it quantizes as shards before a TP collective:
  - column-parallel + sequence parallel: the input X (sequence-sharded, all-gathered in NVFP4);
  - row-parallel + sequence parallel: the output gradient dY (sequence-sharded, all-gathered).
Everything else uses the local amax in TE: the weight shard (W is split over N for column-,
over K for row-parallel), the K-sharded input of a row-parallel layer and the N-sharded output
gradient of a column-parallel layer. Scope "tensor" additionally reduces those three, so that
every operand is quantized with the amax of the whole (unsharded) tensor: TP=1 and TP>1 then
quantize to identical values and differ only by FP32 summation order.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, TypeVar, cast

import torch
import torch.nn.functional as F

from .nvfp4 import BLOCK, fake_quantize, fake_quantize_amax, fake_quantize_rowcol
from .rounding import scratch

if TYPE_CHECKING:
    from ..config.schema import Config

AmaxScope = Literal["te", "tensor"]
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class NVFP4Recipe:
    """The recipe knobs of TE's NVFP4BlockScaling (True = enabled)."""

    rht: bool = False
    """Random Hadamard transform on the Wgrad operands."""
    stochastic_rounding: bool = False
    """Stochastic rounding of the gradient dY (Dgrad and Wgrad operands)."""
    weights_2d: bool = False
    """16x16 weight tiles instead of 1x16 blocks."""

    @classmethod
    def from_config(cls, cfg: Config) -> NVFP4Recipe:
        pr = cfg.precision
        return cls(rht=pr.nvfp4_rht, stochastic_rounding=pr.nvfp4_stochastic_rounding,
                   weights_2d=pr.nvfp4_2d_weights)


@dataclass(frozen=True, slots=True)
class AmaxGroups:
    """Process group over which each operand's global amax is MAX-all-reduced (None: local)."""

    x: torch.distributed.ProcessGroup | None = None
    """The input X (Fprop rowwise and Wgrad columnwise quantizations)."""
    w: torch.distributed.ProcessGroup | None = None
    """The weight W (Fprop and Dgrad)."""
    dy: torch.distributed.ProcessGroup | None = None
    """The output gradient dY (Dgrad rowwise and Wgrad columnwise quantizations)."""


def tp_amax_groups(parallel_mode: Literal["column", "row"] | None, group: torch.distributed.ProcessGroup | None, *,
                   sequence_parallel: bool = False, gathered: bool = True,
                   scope: AmaxScope = "te") -> AmaxGroups:
    """Which operands of a tensor-parallel linear need their amax reduced over `group`.

    parallel_mode: "column" (W split over output features, X replicated or sequence-sharded,
        dY split over N) or "row" (W and X split over K, dY replicated or sequence-sharded).
    sequence_parallel: the layer runs with Megatron's sequence parallelism.
    gathered: the sequence-parallel operand (column: X, row: dY) reaches the GEMM already
        all-gathered (the emulation quantizes after Megatron's collective, where the local amax
        is the global one); False when it is quantized as a shard (as TE does: then reduce).
    scope: "te" reduces what TE reduces; "tensor" also reduces the weight shard, the K-sharded X
        of a row-parallel layer and the N-sharded dY of a column-parallel layer (TP-invariant).
    """
    if parallel_mode not in ("column", "row", None):
        raise ValueError(f"parallel_mode must be 'column', 'row' or None, got {parallel_mode!r}")
    if scope not in ("te", "tensor"):
        raise ValueError(f"amax scope must be 'te' or 'tensor', got {scope!r}")
    if parallel_mode is None or group is None or torch.distributed.get_world_size(group) == 1:
        return AmaxGroups()
    x = w = dy = None
    if sequence_parallel and not gathered:
        if parallel_mode == "column":
            x = group
        else:
            dy = group
    if scope == "tensor":
        w = group
        if parallel_mode == "row":
            x = group
        else:
            dy = group
    return AmaxGroups(x=x, w=w, dy=dy)


def _pad_rows(t: torch.Tensor) -> torch.Tensor:
    """Zero-pad the token dimension to a multiple of 16 for the columnwise (Wgrad) blocks: zero
    rows change neither the amax nor the product."""
    pad = -t.shape[0] % BLOCK
    return F.pad(t, (0, 0, 0, pad)) if pad else t


_INT_OF_SIZE = {4: torch.int32, 2: torch.int16, 8: torch.int64}


class _WeightQuantCache:
    """The quantized operands of a weight, kept while the weight's bits stay the same.

    A weight is quantized identically for every microbatch of a step (rowwise for Fprop,
    columnwise for Dgrad), as TE keeps a weight's quantized copy across the microbatches of a
    step. Whether the weight changed is decided by comparing its bits with a copy taken at
    quantization time (one read of the weight), never by version counters, which in-place
    updates through `.data` bypass. Weights whose amax is reduced over a process group are
    quantized every time (a cache hit on one rank and a miss on another would leave the
    all-reduce unmatched)."""

    def __init__(self) -> None:
        # id(weight) -> (weakref, bits copy, {key: what `make` returned for that key})
        self._entries: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor,
                                       dict[tuple[object, ...], object]]] = {}

    def get(self, weight: torch.Tensor, key: tuple[object, ...], make: Callable[[], _T]) -> _T:
        bits_dtype = _INT_OF_SIZE.get(weight.element_size())
        if bits_dtype is None or weight.is_meta:
            return make()
        bits = weight.detach().view(bits_dtype)
        wid = id(weight)
        entry = self._entries.get(wid)
        if (entry is None or entry[0]() is not weight or entry[1].shape != bits.shape
                or not torch.equal(entry[1], bits)):
            entries = self._entries

            def forget(_: object) -> None:
                entries.pop(wid, None)
            ref = weakref.ref(weight, forget)
            entry = self._entries[wid] = (ref, bits.clone(), {})
        out = entry[2].get(key)
        if out is None:
            out = entry[2][key] = make()
        return cast(_T, out)   # stored by `make` under this key (one kind of value per key)

    def clear(self) -> None:
        self._entries.clear()


WEIGHT_CACHE = _WeightQuantCache()


# Any: fake_quantize's keyword arguments (block, columnwise), passed through
def _quantized_weight(weight: torch.Tensor, group: torch.distributed.ProcessGroup | None, **kw: Any) -> torch.Tensor:
    if group is not None:
        return fake_quantize(weight, amax_group=group, **kw)
    return WEIGHT_CACHE.get(weight, tuple(sorted(kw.items())),
                            lambda: fake_quantize(weight, **kw))


def _quantized_weight_pair(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Fprop (rowwise) and Dgrad (columnwise, transposed back) 1x16 quantized weight, both
    [N, K], quantized together and kept under one cache entry (one comparison of the weight's
    bits per pass)."""
    def make() -> tuple[torch.Tensor, torch.Tensor]:
        row, col, _ = fake_quantize_rowcol(weight)
        return row, col.t()
    return WEIGHT_CACHE.get(weight, ("rowwise+columnwise",), make)


if TYPE_CHECKING:
    class _LinearCtx(torch.autograd.function.FunctionCtx):
        """What NVFP4LinearFunction keeps on its autograd context (FunctionCtx declares none
        of it): the saved tensors (x2d or None, weight, Dgrad weight or None, Wgrad X or None)
        and the attributes forward sets."""

        needs_input_grad: tuple[bool, ...]
        saved_tensors: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None,
                             torch.Tensor | None]
        recipe: NVFP4Recipe
        groups: AmaxGroups
        generator: torch.Generator | None
        has_bias: bool
        bias_dtype: torch.dtype | None
        accumulate_main_grad: bool
        x_shape: torch.Size
        x_dtype: torch.dtype
        x_amax: float

        def save_for_backward(self, *tensors: torch.Tensor | None) -> None: ...


class NVFP4LinearFunction(torch.autograd.Function):
    """Y = X W^T (+ b) with NVFP4-quantized Fprop, Dgrad and Wgrad operands (see module doc).

    accumulate_main_grad: add dW into weight.main_grad (Megatron's gradient accumulation fusion)
    instead of returning it. grad_enabled: autograd records this call (torch.is_grad_enabled()
    outside forward): only then is X's Wgrad operand quantized in forward (with its Fprop
    operand, and saved for backward instead of X), and the weight's Dgrad operand with its Fprop
    one. Every operand has the values of a separate fake_quantize of the same tensor.
    """

    @staticmethod
    def forward(ctx: _LinearCtx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                recipe: NVFP4Recipe, groups: AmaxGroups, generator: torch.Generator | None,
                accumulate_main_grad: bool, grad_enabled: bool) -> torch.Tensor:
        k = x.shape[-1]
        n = weight.shape[0]
        if weight.shape[1] != k:
            raise ValueError(f"NVFP4 linear: input features {k} != weight {tuple(weight.shape)}")
        x2 = x.reshape(-1, k)
        dgrad = grad_enabled and ctx.needs_input_grad[0]
        wgrad = grad_enabled and ctx.needs_input_grad[1]
        xt = None
        if wgrad and not recipe.rht and x2.shape[0] % BLOCK == 0:
            # X for Fprop (rowwise) and for Wgrad (columnwise, kept for backward) together
            xq, xt, _ = fake_quantize_rowcol(x2, amax_group=groups.x)
        else:   # the quantized X is consumed by the GEMM at once: a scratch buffer holds it
            xq, ctx.x_amax = fake_quantize_amax(x2, amax_group=groups.x, out_slot="fprop_x")
        if recipe.weights_2d:   # with 2D tiles the columnwise weight equals the rowwise one
            wq = wdgrad = _quantized_weight(weight, groups.w, block="2d")
        elif dgrad and groups.w is None and n % BLOCK == 0:
            wq, wdgrad = _quantized_weight_pair(weight)
        else:           # no Dgrad, or a reduced amax: the columnwise weight in backward
            wq, wdgrad = _quantized_weight(weight, groups.w, block="1d"), None
        y = torch.matmul(xq, wq.t())
        if bias is not None:
            y = y + bias.float()
        ctx.save_for_backward(None if xt is not None else x2, weight, wdgrad, xt)
        ctx.recipe, ctx.groups, ctx.generator = recipe, groups, generator
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.accumulate_main_grad = accumulate_main_grad
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return y.to(x.dtype).reshape(*x.shape[:-1], n)

    @staticmethod
    def backward(ctx: _LinearCtx, grad_output: torch.Tensor
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None,
                            None, None, None, None, None]:
        x2, weight, wdgrad, xt = ctx.saved_tensors
        recipe, groups, gen = ctx.recipe, ctx.groups, ctx.generator
        n = weight.shape[0]
        dy = grad_output.reshape(-1, n)
        sr, rht = recipe.stochastic_rounding, recipe.rht
        dgrad, wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dx = dw = db = dyq = dyt = dy_amax = None
        # The quantized operands are consumed by the GEMMs at once: scratch buffers hold them.
        # A tensor's rowwise and columnwise quantizations share its global amax, except with
        # RHT (the columnwise amax is then that of the transformed values).
        if dgrad and wgrad and not rht and dy.shape[0] % BLOCK == 0:
            dyq, dyt, _ = fake_quantize_rowcol(
                dy, stochastic=sr, generator=gen, amax_group=groups.dy,
                out=scratch("nvfp4_dy", (2, dy.numel()), torch.float32, dy.device))
        if dgrad:
            if dyq is None:
                dyq, dy_amax = fake_quantize_amax(dy, stochastic=sr, generator=gen,
                                                  amax_group=groups.dy, out_slot="dgrad_dy")
            if wdgrad is None:
                wdgrad = _quantized_weight(weight, groups.w, columnwise=True).t()  # W [N, K]
            dx = torch.matmul(dyq, wdgrad)                                     # [T, K]
            dx = dx.to(ctx.x_dtype).reshape(ctx.x_shape)
        if wgrad:
            if dyt is None:                                                    # [N, T]
                dyt = fake_quantize_amax(_pad_rows(dy), columnwise=True, rht=rht, stochastic=sr,
                                         generator=gen, amax_group=groups.dy,
                                         amax=None if rht else dy_amax, out_slot="wgrad_dy")[0]
            if xt is None:                                                     # [K, T]
                # x2 is saved exactly when xt is not (forward)
                xt = fake_quantize_amax(_pad_rows(cast(torch.Tensor, x2)), columnwise=True, rht=rht,
                                        amax_group=groups.x, amax=None if rht else ctx.x_amax,
                                        out_slot="wgrad_x")[0]
            dw = torch.matmul(dyt, xt.t())                                     # [N, K]
            if ctx.accumulate_main_grad and hasattr(weight, "main_grad"):
                weight.main_grad.add_(dw.to(weight.main_grad.dtype))
                if hasattr(weight, "grad_added_to_main_grad"):
                    # Megatron's DDP skips params whose gradient already went to main_grad
                    dw = torch.zeros(weight.main_grad.shape, dtype=weight.dtype, device=dw.device)
                    weight.grad_added_to_main_grad = True
                else:
                    dw = None
            else:
                dw = dw.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.float().sum(0).to(ctx.bias_dtype)
        return dx, dw, db, None, None, None, None, None


def nvfp4_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 recipe: NVFP4Recipe = NVFP4Recipe(), amax_groups: AmaxGroups = AmaxGroups(),
                 generator: torch.Generator | None = None,
                 accumulate_main_grad: bool = False) -> torch.Tensor:
    """F.linear(x, weight, bias) with NVFP4-quantized GEMM operands (autograd-aware)."""
    # torch 2.13 types Function.apply's result Any: it is forward's
    return cast(torch.Tensor, NVFP4LinearFunction.apply(
        x, weight, bias, recipe, amax_groups, generator, accumulate_main_grad,
        torch.is_grad_enabled()))
