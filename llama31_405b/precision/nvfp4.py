"""NVFP4 quantization in pure PyTorch, with exactly Transformer Engine's arithmetic.

Specification: docs/nvfp4.md (and the TE recipe it summarises). All arithmetic is FP32:

    amax  = max|x|                                   (optionally MAX-all-reduced over a group)
    S_enc = min(2688 / amax, FLT_MAX); 1 if amax == 0 or S_enc == 0;   S_dec = 1 / S_enc
    s_b   = e4m3_rne_saturating(amax_b * (S_enc * fl32(1/6)))          one per block
    enc_b = min(1 / (float(s_b) * S_dec), FLT_MAX)
    q     = RNE_e2m1(clamp(x * enc_b, -6, 6))     (or stochastic rounding, gradients only)
    x_hat = e2m1(q) * float(s_b) * S_dec

Blocks are 16 consecutive elements of the last dimension of the quantized layout ("1d"), or
16x16 tiles ("2d", weights). `columnwise=True` quantizes the transpose of the 2D view, i.e. the
blocks run along the first dimension (what the Dgrad/Wgrad GEMMs consume). With `rht=True` every
16-element block is first multiplied by the random Hadamard matrix (diag(s) H16 / 4) and rounded
to BF16, as TE does for the Wgrad operands.

`fake_quantize` returns the values of `dequantize(quantize(x))` (precision/packed.py: the packed
format) without packing, bit-identical, and `fake_quantize_rowcol` both layouts of one tensor at
once (the fast path of the NVFP4 linear layer; its round-to-nearest case, and that of a rowwise
`fake_quantize_amax`, run in the C kernel of precision/native.py, with the same bits).
"""
from __future__ import annotations

import struct
from typing import Literal

import numpy as np
import torch

from . import native
from .rounding import (_C_E2M1, _C_E4M3, _E4M3_MIN_NORMAL, E2M1_MAX, _consts, round_e2m1,
                       round_e2m1_, round_e4m3_, rowcol_work, scratch, stochastic_round_e2m1)

FLT_MAX = torch.finfo(torch.float32).max
E4M3_MAX = 448.0
BLOCK = 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# the fixed sign vector of TE's random Hadamard transform (shared by every layer and step)
RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)

BlockKind = Literal["1d", "2d"]


# --------------------------------------------------------------------------------------------
# building blocks
# --------------------------------------------------------------------------------------------

def rht_matrix(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16x16 random Hadamard matrix M = diag(s) * H16 / 4 (orthogonal, FP32)."""
    h = torch.ones(1, 1, dtype=torch.float32)
    while h.shape[0] < BLOCK:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    s = torch.tensor(RHT_SIGNS, dtype=torch.float32)
    return (s[:, None] * h / 4.0).to(device)


_RHT_CACHE: dict[torch.device, torch.Tensor] = {}


def _rht(device: torch.device) -> torch.Tensor:
    m = _RHT_CACHE.get(device)
    if m is None:
        m = _RHT_CACHE.setdefault(device, rht_matrix(device))
    return m


def apply_rht(x2d: torch.Tensor, axis: int = 1) -> torch.Tensor:
    """x' = x * M on every 16-element chunk along `axis` (1: rows of the last dim, 0: columns
    of the first dim), rounded to BF16 (returned as FP32)."""
    m = _rht(x2d.device)
    rows, cols = x2d.shape
    if axis == 1:
        y = torch.matmul(x2d.float().reshape(rows, cols // BLOCK, BLOCK), m)
    else:   # chunk c (16 x cols): x'^T = (x^T M) -> x' = M^T x
        y = torch.matmul(m.t(), x2d.float().reshape(rows // BLOCK, BLOCK, cols))
    return y.to(torch.bfloat16).float().reshape(rows, cols)


def undo_rht(x2d: torch.Tensor, axis: int = 1) -> torch.Tensor:
    """Inverse transform x = x' * M^T per 16-element chunk along `axis` (FP32, no rounding)."""
    m = _rht(x2d.device)
    rows, cols = x2d.shape
    if axis == 1:
        return torch.matmul(x2d.reshape(rows, cols // BLOCK, BLOCK), m.t()).reshape(rows, cols)
    return torch.matmul(m, x2d.reshape(rows // BLOCK, BLOCK, cols)).reshape(rows, cols)


def global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """S_enc = min(2688 / amax, FLT_MAX), or 1 when amax == 0 or S_enc == 0 (FP32 scalar)."""
    amax = amax.float()
    s = torch.clamp(torch.tensor(E4M3_MAX * E2M1_MAX, dtype=torch.float32) / amax, max=FLT_MAX)
    return torch.where((amax == 0) | (s == 0), torch.ones_like(s), s)


# --------------------------------------------------------------------------------------------
# the core: blocks, scales and rounded values of a 2D layout
# --------------------------------------------------------------------------------------------

def _as_2d(x: torch.Tensor) -> torch.Tensor:
    x2d = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    return x2d.float().contiguous()


def _check_shape(rows: int, cols: int, block: str, rht: bool, columnwise: bool) -> None:
    if block not in ("1d", "2d"):
        raise ValueError(f"NVFP4 block must be '1d' or '2d', got {block!r}")
    blocked = rows if columnwise else cols
    if blocked % BLOCK or (block == "2d" and cols % BLOCK):
        raise ValueError(f"NVFP4: the blocked dimension ({blocked}) must be a multiple of {BLOCK}")
    if rht and block != "1d":
        raise ValueError("NVFP4: the random Hadamard transform applies to 1d (1x16) blocks only")


def _reduce_amax(amax: torch.Tensor, group: torch.distributed.ProcessGroup | None) -> torch.Tensor:
    if group is not None and torch.distributed.get_world_size(group) > 1:
        amax = amax.clone()
        torch.distributed.all_reduce(amax, op=torch.distributed.ReduceOp.MAX, group=group)
    return amax


def _max_abs(a: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """Max over `dim` of a non-negative FP32 tensor (|x|), taken on the int32 bit patterns, which
    order as the values do (and a NaN's above +inf): a vectorised integer reduction, several
    times faster on CPU than the float one over a contiguous dimension of 16 (or max_pool1d)."""
    return a.view(torch.int32).amax(dim, keepdim=keepdim).view(torch.float32)


def _block_amax(x2d: torch.Tensor, block: str, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocked view of x2d and the per-block amax shaped to broadcast over it.

    axis 1: blocks of 16 along the last dim; axis 0: along the first dim; 2d: 16x16 tiles."""
    rows, cols = x2d.shape
    a = torch.abs(x2d, out=scratch("abs", x2d, torch.float32))
    if block == "2d":
        xb = x2d.view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
        col_max = _max_abs(a.view(rows // BLOCK, BLOCK, cols), 1)            # (rb, cols)
        return xb, _max_abs(col_max.view(rows // BLOCK, cols // BLOCK, BLOCK), 2)[:, None, :, None]
    if axis == 0:
        return (x2d.view(rows // BLOCK, BLOCK, cols),
                _max_abs(a.view(rows // BLOCK, BLOCK, cols), 1, keepdim=True))  # (rb, 1, cols)
    return (x2d.view(rows, cols // BLOCK, BLOCK),
            _max_abs(a.view(rows, cols // BLOCK, BLOCK), 2, keepdim=True))      # (rows, nb, 1)


_INV6_F32 = float(np.float32(1.0 / 6.0))   # fl32(1/6)
_F32, _U32 = struct.Struct("f"), struct.Struct("I")


def _fl32(v: float) -> float:
    """v rounded to FP32 (round to nearest even), as a Python float; |v| <= FLT_MAX."""
    return _F32.unpack(_F32.pack(v))[0]


def encode_scales(amax: float) -> tuple[float, float]:
    """(S_enc, S_dec) of a global amax, computed on the host in FP32, as Python floats holding
    FP32 values: the values global_encode_scale and its reciprocal give, without a dozen 0-d
    tensor operations per quantization. A quotient of FP32 values computed in double and rounded
    once to FP32 is the correctly rounded FP32 quotient (53 >= 2 * 24 + 2 bits)."""
    if amax == 0:
        return 1.0, 1.0
    q = (E4M3_MAX * E2M1_MAX) / amax           # a NaN amax gives NaN scales
    s = FLT_MAX if q > FLT_MAX else _fl32(q)   # min(2688 / amax, FLT_MAX)
    if s == 0:
        s = 1.0
    return s, _fl32(1.0 / s)


def _encode_bits(bits: int, amax_group: torch.distributed.ProcessGroup | None,
                 device: torch.device) -> tuple[float, float, float]:
    """(amax, fl32(S_enc / 6), S_dec) from the bits of max|x| the C kernel found (native.py),
    the amax MAX-reduced over the group first if any."""
    amax = _F32.unpack(_U32.pack(bits))[0]
    if amax_group is not None:
        amax = _reduce_amax(torch.tensor(amax, device=device), amax_group).item()
    s_enc, s_dec = encode_scales(amax)
    return amax, _fl32(s_enc * _INV6_F32), s_dec


def _block_scales(amax_b: torch.Tensor, s_enc: float,
                  s_dec: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(s_b, enc_b) of block amaxes: the e4m3 block scales as FP32 values and the encode factors
    min(1 / (s_b * S_dec), FLT_MAX)."""
    s_b = round_e4m3_(torch.mul(amax_b, _fl32(s_enc * _INV6_F32)).clamp_(max=E4M3_MAX))
    return s_b, torch.mul(s_b, s_dec).reciprocal_().clamp_(max=FLT_MAX)


_SEVEN_BITS = 0x40E00000   # the FP32 bit pattern of 7.0


def _round_(y: torch.Tensor, stochastic: bool, generator: torch.Generator | None,
            amax_b: torch.Tensor,
            enc_b: torch.Tensor) -> torch.Tensor:
    """In place: clamp scaled values y = x * enc_b to [-6, 6] and round them to E2M1 (RNE or
    stochastic). amax_b, enc_b: the block amaxes and encode factors (same shape).

    RNE skips the clamp (a pass over y) when every block's largest scaled value
    amax_b * enc_b is below 7 (checked on the block values, one small pass): then so is every
    |y| (rounding is monotonic), and round_e2m1_ already rounds (6, 7) to 6, its step there
    being 2. This holds unless a block scale underflows to a subnormal e4m3 or an element is
    infinite or NaN (whose amax_b * enc_b is then not below 7: the clamp runs)."""
    if stochastic:
        y.clamp_(-E2M1_MAX, E2M1_MAX)
        return stochastic_round_e2m1(y, generator)
    if (not amax_b.numel()
            or torch.mul(amax_b, enc_b).view(torch.int32).amax().item() >= _SEVEN_BITS):
        y.clamp_(-E2M1_MAX, E2M1_MAX)
    return round_e2m1_(y)


def _quantize_core(x2d: torch.Tensor, *, axis: int, block: str, rht: bool, stochastic: bool,
                   generator: torch.Generator | None, amax_group: torch.distributed.ProcessGroup | None,
                   amax: float | None = None, out_slot: str | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float, float]:
    """Quantize a contiguous FP32 2D tensor with blocks along `axis`; everything in x2d's layout.

    amax: the global amax when already known (after any group reduction): neither recomputed
    nor reduced again. out_slot: compute the values in this scratch buffer (else a new tensor).
    Returns (x2d after RHT/padding, signed E2M1 values (blocked view), block scales as FP32
    e4m3 values (broadcastable), amax (float), S_enc, S_dec (floats holding FP32 values)).
    Scalars multiply tensors as Python floats holding FP32 values: CPU kernels compute a float
    tensor times a scalar in FP32, as with a 0-d FP32 tensor."""
    if rht:
        x2d = apply_rht(x2d, axis)
    rows = x2d.shape[0]
    if block == "2d" and rows % BLOCK:
        x2d = torch.nn.functional.pad(x2d, (0, 0, 0, -rows % BLOCK))
    xb, amax_b = _block_amax(x2d, block, axis)
    if amax is None:
        amax_t = amax_b.amax() if amax_b.numel() else torch.zeros((), device=x2d.device)
        amax = _reduce_amax(amax_t, amax_group).item()
    s_enc, s_dec = encode_scales(amax)
    s_b, enc_b = _block_scales(amax_b, s_enc, s_dec)
    y = torch.mul(xb, enc_b, out=scratch(out_slot, xb, torch.float32) if out_slot else None)
    return x2d, _round_(y, stochastic, generator, amax_b, enc_b), s_b, amax, s_enc, s_dec


def fake_quantize_amax(x: torch.Tensor, *, block: BlockKind = "1d", columnwise: bool = False,
                       rht: bool = False, stochastic: bool = False,
                       generator: torch.Generator | None = None,
                       amax_group: torch.distributed.ProcessGroup | None = None, amax: float | None = None,
                       out_slot: str | None = None) -> tuple[torch.Tensor, float]:
    """fake_quantize, and the global amax it used (a float, after any group reduction).

    A tensor quantized twice (rowwise and columnwise, without RHT) has one global amax, max|x|:
    pass the first one's as `amax` to the second to skip computing and reducing it again (with
    RHT the amax is that of the transformed values: do not pass it). out_slot: the result lives
    in that per-thread scratch buffer (precision.rounding.scratch), valid until the next request
    for the slot: for operands consumed at once (no allocation, no page faults)."""
    x2d = _as_2d(x)
    rows, cols = x2d.shape
    _check_shape(rows, cols, block, rht, columnwise)
    if (block == "1d" and not (columnwise or rht or stochastic) and amax is None and x2d.numel()
            and (kern := native.kernel_for(x2d.device))):     # the same arithmetic, fused
        return native.rowwise(kern, x2d, out_slot,
                              lambda bits: _encode_bits(bits, amax_group, x2d.device))
    _, v, s_b, amax, _, s_dec = _quantize_core(
        x2d, axis=0 if columnwise else 1, block=block, rht=rht, stochastic=stochastic,
        generator=generator, amax_group=amax_group, amax=amax, out_slot=out_slot)
    out = v.mul_(s_b).mul_(s_dec).view(-1, cols)[:rows]  # (e2m1 * s_b) * S_dec; 1st exact
    return (out.t() if columnwise else out), amax


def fake_quantize(x: torch.Tensor, *, block: BlockKind = "1d", columnwise: bool = False,
                  rht: bool = False, stochastic: bool = False,
                  generator: torch.Generator | None = None,
                  amax_group: torch.distributed.ProcessGroup | None = None) -> torch.Tensor:
    """dequantize(quantize(x, ...)) in FP32, without packing; returned in the quantized layout
    (the 2D view of x, transposed (a view) when columnwise). Bit-identical to the packed round
    trip. Columnwise blocks are processed in place along the first dimension (no transpose)."""
    return fake_quantize_amax(x, block=block, columnwise=columnwise, rht=rht,
                              stochastic=stochastic, generator=generator,
                              amax_group=amax_group)[0]


def fake_quantize_rowcol(x: torch.Tensor, *, stochastic: bool = False,
                         generator: torch.Generator | None = None,
                         amax_group: torch.distributed.ProcessGroup | None = None, out: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(fake_quantize(x), fake_quantize(x, columnwise=True), amax), 1x16 blocks without RHT, as
    the two calls in that order give them (stochastic rounding draws the rowwise bits first),
    computed together: one |x| and one global amax, the block scales of both in one small
    tensor, and the two results side by side in one buffer (`out`: 2 * x.numel() FP32
    elements, else a new tensor), so every step after the block scaling runs once over both.
    The 2D view of x must have a multiple of 16 rows and columns."""
    x2d = _as_2d(x)
    rows, cols = x2d.shape
    _check_shape(rows, cols, "1d", False, False)
    _check_shape(rows, cols, "1d", False, True)
    n, rb, cb = rows * cols, rows // BLOCK, cols // BLOCK
    dev = x2d.device
    y = torch.empty(2, n, device=dev) if out is None else out.view(2, n)
    if not n:
        amax = _reduce_amax(torch.zeros((), device=dev), amax_group).item()
        return y[0].view(rows, cols), y[1].view(rows, cols).t(), amax
    w = rowcol_work(rows, cols, dev)
    off = y.storage_offset()
    views = (y.as_strided((rows, cols), (cols, 1), off),
             y.as_strided((cols, rows), (1, cols), off + n))
    if not stochastic and y.is_contiguous() and (kern := native.kernel_for(dev)):  # fused
        return (*views, native.rowcol(kern, x2d, w, y,
                                      lambda bits: _encode_bits(bits, amax_group, dev)))
    # The arithmetic of _block_amax, _block_scales, _round_ and fake_quantize_amax, step for
    # step, on a per-shape workspace (rounding.RowColWork) and fixed views of the result.
    torch.abs(x2d, out=w.abs)
    torch.amax(w.abs_row, 2, out=w.amax_row)                # int32 maxima: see _max_abs
    torch.amax(w.abs_col, 1, out=w.amax_col)
    amax = _reduce_amax(w.amax_first.amax(), amax_group).item()
    s_enc, s_dec = encode_scales(amax)
    s_b = torch.mul(w.amax, _fl32(s_enc * _INV6_F32), out=w.s_b).clamp_(max=E4M3_MAX)
    mask = _consts(dev)[0]
    torch.bitwise_and(s_b.view(torch.int32), mask, out=w.exp_small)
    w.exp_small_f.clamp_(_E4M3_MIN_NORMAL, None)                       # round_e4m3_
    s_b.add_(w.exp_small_f, alpha=_C_E4M3).sub_(w.exp_small_f, alpha=_C_E4M3)
    torch.mul(s_b, s_dec, out=w.enc).reciprocal_().clamp_(max=FLT_MAX)
    row = y.as_strided((rows, cb, BLOCK), (cols, BLOCK, 1), off)
    col = y.as_strided((rb, BLOCK, cols), (BLOCK * cols, cols, 1), off + n)
    torch.mul(x2d.view(rows, cb, BLOCK), w.enc_row, out=row)
    torch.mul(x2d.view(rb, BLOCK, cols), w.enc_col, out=col)
    if stochastic:
        y.clamp_(-E2M1_MAX, E2M1_MAX)
        stochastic_round_e2m1(y, generator)
    else:                                                              # _round_, round_e2m1_
        if torch.mul(w.amax, w.enc, out=w.top).view(torch.int32).amax().item() >= _SEVEN_BITS:
            y.clamp_(-E2M1_MAX, E2M1_MAX)
        torch.bitwise_and(y.view(torch.int32), mask, out=w.exp)
        w.exp_f.clamp_(1.0, 4.0)
        y.add_(w.exp_f, alpha=_C_E2M1).sub_(w.exp_f, alpha=_C_E2M1)
    row.mul_(w.s_b_row)
    col.mul_(w.s_b_col)
    y.mul_(s_dec)                                   # (e2m1 * s_b) * S_dec; the first exact
    return (*views, amax)
