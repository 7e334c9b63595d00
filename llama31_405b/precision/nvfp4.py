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

`quantize` returns the packed representation; `fake_quantize` returns `dequantize(quantize(x))`
directly without packing (the fast path used by the NVFP4 linear layer; bit-identical).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

FLT_MAX = torch.finfo(torch.float32).max
E2M1_MAX = 6.0
E4M3_MAX = 448.0
BLOCK = 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# the fixed sign vector of TE's random Hadamard transform (shared by every layer and step)
RHT_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
_INV6 = torch.tensor(1.0 / 6.0, dtype=torch.float32)  # fl32(1/6)

BlockKind = Literal["1d", "2d"]


@dataclass(frozen=True, slots=True)
class NVFP4Tensor:
    """A tensor in NVFP4. `data` holds E2M1 codes of the quantized layout (rows, cols), two per
    byte, element 2i in the low nibble. The quantized layout is the 2D view of the input
    (leading dims flattened) or, when `columnwise`, its transpose."""

    data: torch.Tensor
    """uint8 (rows, cols // 2): packed E2M1 codes."""
    scales: torch.Tensor
    """float8_e4m3fn block scales: (rows, cols // 16) for 1d, (ceil(rows / 16), cols // 16) for 2d."""
    amax: torch.Tensor
    """FP32 scalar: global amax used for the encode scale (after any group reduction)."""
    scale: torch.Tensor
    """FP32 scalar: S_enc, the global encode scale (S_dec = 1 / S_enc)."""
    shape: tuple[int, ...]
    """Shape of the original tensor."""
    dtype: torch.dtype
    """Dtype of the original tensor (dequantize returns FP32 unless asked otherwise)."""
    block: BlockKind
    """1d (1x16) or 2d (16x16) scaling blocks."""
    columnwise: bool
    """True when the blocks run along the first dimension of the 2D view (quantized transpose)."""
    rht: bool
    """True when the values are in the random-Hadamard-transformed domain."""

    @property
    def scale_inv(self) -> torch.Tensor:
        """S_dec = 1 / S_enc (FP32)."""
        return torch.reciprocal(self.scale)

    @property
    def layout_shape(self) -> tuple[int, int]:
        """(rows, cols) of the quantized layout."""
        return (self.data.shape[0], self.data.shape[1] * 2)

    def codes(self) -> torch.Tensor:
        """Unpacked E2M1 codes 0..15, uint8 (rows, cols) in the quantized layout."""
        lo = self.data & 0x0F
        hi = self.data >> 4
        return torch.stack((lo, hi), dim=-1).reshape(self.layout_shape)


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


def apply_rht(x2d: torch.Tensor) -> torch.Tensor:
    """x' = x * M on every 16-element chunk of the last dim, rounded to BF16 (returned as FP32)."""
    m = _RHT_CACHE.get(x2d.device)
    if m is None:
        m = _RHT_CACHE.setdefault(x2d.device, rht_matrix(x2d.device))
    rows, cols = x2d.shape
    y = torch.matmul(x2d.float().reshape(rows, cols // BLOCK, BLOCK), m)
    return y.to(torch.bfloat16).float().reshape(rows, cols)


def undo_rht(x2d: torch.Tensor) -> torch.Tensor:
    """Inverse transform x = x' * M^T on every 16-element chunk (FP32, no rounding)."""
    m = _RHT_CACHE.get(x2d.device)
    if m is None:
        m = _RHT_CACHE.setdefault(x2d.device, rht_matrix(x2d.device))
    rows, cols = x2d.shape
    return torch.matmul(x2d.reshape(rows, cols // BLOCK, BLOCK), m.t()).reshape(rows, cols)


def global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """S_enc = min(2688 / amax, FLT_MAX), or 1 when amax == 0 or S_enc == 0 (FP32 scalar)."""
    amax = amax.float()
    s = torch.clamp(torch.tensor(E4M3_MAX * E2M1_MAX, dtype=torch.float32) / amax, max=FLT_MAX)
    return torch.where((amax == 0) | (s == 0), torch.ones_like(s), s)


def round_e2m1(a: torch.Tensor) -> torch.Tensor:
    """Round non-negative FP32 magnitudes in [0, 6] to the nearest E2M1 value, ties to even.

    The E2M1 grid has step 0.5 on [0, 2), 1 on [2, 4) and 2 on [4, 6]; scaling by the inverse step
    (a power of two, exact) maps each segment onto the integers, where torch.round is RNE. The
    even integer is the even mantissa: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
    """
    inv_step = torch.where(a < 2.0, 2.0, torch.where(a < 4.0, 1.0, 0.5))
    return torch.round(a * inv_step) / inv_step


def _step(a: torch.Tensor) -> torch.Tensor:
    return torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, 2.0))


def stochastic_round_e2m1(a: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Stochastic rounding of magnitudes in [0, 6] with 8 random bits per element:
    u = r/256, t = a + u*step(a), q = min(floor(t/step(t))*step(t), 6)."""
    r = torch.randint(0, 256, a.shape, generator=generator, dtype=torch.uint8, device=a.device)
    t = a + (r.float() * (1.0 / 256.0)) * _step(a)
    st = _step(t)
    return torch.clamp(torch.floor(t / st) * st, max=E2M1_MAX)


def _magnitude_codes(v: torch.Tensor) -> torch.Tensor:
    """E2M1 magnitude code 0..7 of exactly representable magnitudes v."""
    # 0,0.5,1,1.5 -> 0..3 (v*2); 2,3 -> 4,5 (v+2); 4,6 -> 6,7 (v/2+4)
    return torch.where(v < 2.0, v * 2.0, torch.where(v < 4.0, v + 2.0, v * 0.5 + 4.0)).to(torch.uint8)


# --------------------------------------------------------------------------------------------
# the core: blocks, scales and rounded values of a 2D layout
# --------------------------------------------------------------------------------------------

def _layout(x: torch.Tensor, columnwise: bool) -> torch.Tensor:
    x2d = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if columnwise:
        x2d = x2d.t()
    return x2d.float().contiguous()


def _check_shape(rows: int, cols: int, block: str, rht: bool) -> None:
    if block not in ("1d", "2d"):
        raise ValueError(f"NVFP4 block must be '1d' or '2d', got {block!r}")
    if cols % BLOCK:
        raise ValueError(f"NVFP4: the blocked dimension ({cols}) must be a multiple of {BLOCK}")
    if rht and block != "1d":
        raise ValueError("NVFP4: the random Hadamard transform applies to 1d (1x16) blocks only")


def _reduce_amax(amax: torch.Tensor, group) -> torch.Tensor:
    if group is not None and torch.distributed.get_world_size(group) > 1:
        amax = amax.clone()
        torch.distributed.all_reduce(amax, op=torch.distributed.ReduceOp.MAX, group=group)
    return amax


def _quantize_layout(x2d: torch.Tensor, block: str, stochastic: bool,
                     generator: torch.Generator | None, amax_group):
    """Returns (signed rounded E2M1 values in x2d's layout, block scales (FP32 of the e4m3 value)
    broadcastable per block, 2D compact block scales, amax, S_enc)."""
    rows, cols = x2d.shape
    amax = _reduce_amax(x2d.abs().amax() if x2d.numel() else torch.zeros((), dtype=torch.float32),
                        amax_group)
    s_enc = global_encode_scale(amax)
    s_dec = torch.reciprocal(s_enc)
    if block == "1d":
        xb = x2d.reshape(rows, cols // BLOCK, BLOCK)
        amax_b = xb.abs().amax(-1, keepdim=True)                      # (rows, nb, 1)
    else:
        pr = -rows % BLOCK
        xp = torch.nn.functional.pad(x2d, (0, 0, 0, pr)) if pr else x2d
        xb = xp.reshape((rows + pr) // BLOCK, BLOCK, cols // BLOCK, BLOCK)
        amax_b = xb.abs().amax(dim=(1, 3), keepdim=True)              # (rb, 1, nb, 1)
    s_b = torch.clamp(amax_b * (s_enc * _INV6.to(s_enc.device)), max=E4M3_MAX).to(torch.float8_e4m3fn).float()
    enc_b = torch.clamp(torch.reciprocal(s_b * s_dec), max=FLT_MAX)
    y = torch.clamp(xb * enc_b, -E2M1_MAX, E2M1_MAX)
    a = y.abs()
    v = stochastic_round_e2m1(a, generator) if stochastic else round_e2m1(a)
    v = torch.where(y < 0, -v, v)
    return v, s_b, amax, s_enc, s_dec, xb.shape


def fake_quantize(x: torch.Tensor, *, block: BlockKind = "1d", columnwise: bool = False,
                  rht: bool = False, stochastic: bool = False,
                  generator: torch.Generator | None = None, amax_group=None) -> torch.Tensor:
    """dequantize(quantize(x, ...)) in FP32, without packing; returned in the quantized layout
    (the 2D view of x, transposed when columnwise). Bit-identical to the packed round trip."""
    x2d = _layout(x, columnwise)
    rows, cols = x2d.shape
    _check_shape(rows, cols, block, rht)
    if rht:
        x2d = apply_rht(x2d)
    v, s_b, _, _, s_dec, bshape = _quantize_layout(x2d, block, stochastic, generator, amax_group)
    out = (v * s_b) * s_dec
    if block == "2d":
        out = out.reshape(bshape[0] * BLOCK, cols)[:rows]
    return out.reshape(rows, cols)


def quantize(x: torch.Tensor, *, block: BlockKind = "1d", rht: bool = False,
             stochastic: bool = False, generator: torch.Generator | None = None,
             columnwise: bool = False, amax_group=None) -> NVFP4Tensor:
    """Quantize x to NVFP4 with TE's arithmetic.

    block: "1d" (1x16 blocks along the last dim of the layout) or "2d" (16x16 tiles, weights).
    rht: apply the random Hadamard transform to each 16-element block first (1d only).
    stochastic: stochastic rounding of the E2M1 values (8 random bits each, from `generator`).
    columnwise: quantize the transpose of the 2D view (blocks along the first dim).
    amax_group: process group over which the global amax is MAX-all-reduced (sharded tensors).
    """
    x2d = _layout(x, columnwise)
    rows, cols = x2d.shape
    _check_shape(rows, cols, block, rht)
    if rht:
        x2d = apply_rht(x2d)
    v, s_b, amax, s_enc, _, _ = _quantize_layout(x2d, block, stochastic, generator, amax_group)
    if block == "2d":
        v = v.reshape(-1, cols)[:rows]
        scales = s_b.reshape(s_b.shape[0], s_b.shape[2])
    else:
        v = v.reshape(rows, cols)
        scales = s_b.reshape(rows, cols // BLOCK)
    codes = _magnitude_codes(v.abs()) | torch.where(v < 0, 8, 0).to(torch.uint8)
    # a negative element that rounds to zero keeps its sign: code 8 (-0)
    codes = torch.where((x2d < 0) & (v == 0), torch.full_like(codes, 8), codes)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return NVFP4Tensor(data=packed.contiguous(), scales=scales.to(torch.float8_e4m3fn),
                       amax=amax.float(), scale=s_enc, shape=tuple(x.shape), dtype=x.dtype,
                       block=block, columnwise=columnwise, rht=rht)


_CODE_VALUES = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32)


def dequantize(q: NVFP4Tensor, *, layout: bool = False, undo_rht_transform: bool = False,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x_hat = e2m1(q) * float(s_b) * S_dec (FP32 arithmetic).

    By default the result has the original shape (a columnwise tensor is transposed back);
    layout=True returns the quantized layout instead. Values of an RHT tensor stay in the
    transformed domain unless undo_rht_transform=True (x_hat * M^T per block, FP32).
    """
    rows, cols = q.layout_shape
    vals = _CODE_VALUES.to(q.data.device)[q.codes().long()]
    s = q.scales.float()
    if q.block == "2d":
        s = s.repeat_interleave(BLOCK, dim=0)[:rows].repeat_interleave(BLOCK, dim=1)
    else:
        s = s.repeat_interleave(BLOCK, dim=1)
    out = (vals * s) * torch.reciprocal(q.scale)
    if q.rht and undo_rht_transform:
        out = undo_rht(out)
    if layout:
        return out.to(dtype)
    if q.columnwise:
        out = out.t()
    return out.reshape(q.shape).to(dtype)
