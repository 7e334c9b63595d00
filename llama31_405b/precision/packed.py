"""The packed NVFP4 format: E2M1 codes two per byte, E4M3 block scales and the FP32 global scale,
as Transformer Engine stores an NVFP4 tensor. `quantize` packs with the arithmetic of
precision/nvfp4.py (whose `fake_quantize` gives the same values without packing); `dequantize`
unpacks. The emulation's GEMMs do not need it: tests and inspection do."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .nvfp4 import (BLOCK, E2M1_VALUES, BlockKind, _as_2d, _check_shape, _quantize_core,
                    undo_rht)


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


def _magnitude_codes(v: torch.Tensor) -> torch.Tensor:
    """E2M1 magnitude code 0..7 of exactly representable magnitudes v."""
    # 0,0.5,1,1.5 -> 0..3 (v*2); 2,3 -> 4,5 (v+2); 4,6 -> 6,7 (v/2+4)
    return torch.where(v < 2.0, v * 2.0, torch.where(v < 4.0, v + 2.0, v * 0.5 + 4.0)).to(torch.uint8)


def quantize(x: torch.Tensor, *, block: BlockKind = "1d", rht: bool = False,
             stochastic: bool = False, generator: torch.Generator | None = None,
             columnwise: bool = False,
             amax_group: torch.distributed.ProcessGroup | None = None) -> NVFP4Tensor:
    """Quantize x to NVFP4 with TE's arithmetic.

    block: "1d" (1x16 blocks along the last dim of the layout) or "2d" (16x16 tiles, weights).
    rht: apply the random Hadamard transform to each 16-element block first (1d only).
    stochastic: stochastic rounding of the E2M1 values (8 random bits each, from `generator`).
    columnwise: quantize the transpose of the 2D view (blocks along the first dim).
    amax_group: process group over which the global amax is MAX-all-reduced (sharded tensors).
    """
    x2d = _as_2d(x)
    rows, cols = x2d.shape
    _check_shape(rows, cols, block, rht, columnwise)
    axis = 0 if columnwise else 1
    xr, v, s_b, amax, s_enc, _ = _quantize_core(x2d, axis=axis, block=block, rht=rht,
                                                stochastic=stochastic, generator=generator,
                                                amax_group=amax_group)
    v = v.reshape(-1, cols)[:rows]
    xr = xr[:rows]
    if block == "2d":
        scales = s_b[:, 0, :, 0]                       # (rows/16, cols/16)
    elif axis == 0:
        scales = s_b[:, 0, :]                          # (rows/16, cols)
    else:
        scales = s_b[:, :, 0]                          # (rows, cols/16)
    if columnwise:                                     # to the quantized layout
        v, xr, scales = v.t(), xr.t(), scales.t()
    codes = _magnitude_codes(v.abs()) | torch.where(v < 0, 8, 0).to(torch.uint8)
    # a negative element that rounds to zero keeps its sign: code 8 (-0)
    codes = torch.where((xr < 0) & (v == 0), torch.full_like(codes, 8), codes).contiguous()
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return NVFP4Tensor(data=packed.contiguous(), scales=scales.contiguous().to(torch.float8_e4m3fn),
                       amax=torch.tensor(amax, dtype=torch.float32, device=x2d.device),
                       scale=torch.tensor(s_enc, dtype=torch.float32, device=x2d.device), shape=tuple(x.shape), dtype=x.dtype,
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
