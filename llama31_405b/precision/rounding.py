"""Rounding kernels of the NVFP4 emulation (precision.nvfp4), as few passes over memory as
exactness allows, and the per-thread scratch buffers their temporaries live in.

All take non-negative or signed FP32 values already in the target format's range and work in
place:
    E2M1 RNE: round to the nearest E2M1 value, ties to even (round-to-nearest quantization);
    E2M1 SR:  stochastic rounding with 8 random bits per element (TE's gradient rounding);
    E4M3 RNE: round to the nearest float8_e4m3fn value (block scales), the value torch's
              float8_e4m3fn cast gives (round to nearest even, subnormals in steps of 2^-9).
The exponent field of an FP32 value is read through an int32 view of its bits; every trick here
is exact (powers of two, IEEE additions whose rounding is the rounding wanted).
"""
from __future__ import annotations

import threading

import torch

E2M1_MAX = 6.0

# Per-thread scratch buffers for the full-size temporaries of a quantization (|x|, exponent bits,
# stochastic-rounding sums) and for operands a caller consumes at once. Fresh multi-MB CPU
# allocations are served by mmap and pay a page fault per 4 KiB on first touch, which costs more
# than the arithmetic.
_SCRATCH = threading.local()
_SCRATCH_SLOTS = 24


def scratch(slot: str, like: torch.Tensor | tuple[int, ...], dtype: torch.dtype,
            device: torch.device | None = None) -> torch.Tensor:
    """A reusable buffer shaped like `like` (a tensor, or a shape with `device`); `slot` names
    one temporary of one computation. Valid until the next request for the same slot and size."""
    shape = tuple(like.shape) if isinstance(like, torch.Tensor) else tuple(like)
    device = like.device if isinstance(like, torch.Tensor) else device
    numel = 1
    for d in shape:
        numel *= d
    cache: dict[tuple[str, int, torch.dtype, torch.device | None], torch.Tensor] | None = (
        getattr(_SCRATCH, "bufs", None))
    if cache is None:
        cache = _SCRATCH.bufs = {}
    key = (slot, numel, dtype, device)
    buf = cache.pop(key, None)
    if buf is None:
        buf = torch.empty(numel, dtype=dtype, device=device)
        while len(cache) >= _SCRATCH_SLOTS:
            cache.pop(next(iter(cache)))
    cache[key] = buf                          # most recently used last
    return buf.view(shape)


class RowColWork:
    """Buffers, and views of them, for quantizing a (rows, cols) FP32 tensor rowwise and
    columnwise together (nvfp4.fake_quantize_rowcol), made once per shape and thread: |x| as
    int32 bits in both blockings, the block amaxes, scales and encode factors of both layouts
    (index 0 rowwise, 1 columnwise) with their broadcast views, and the exponent bits of the
    rounding. At the tiny model's sizes building ~40 views and temporaries per call cost about
    as much as a pass over the data."""

    def __init__(self, rows: int, cols: int, device: torch.device) -> None:
        n, m, rb, cb = rows * cols, rows * cols // 16, rows // 16, cols // 16
        f32, i32 = torch.float32, torch.int32
        self.abs = torch.empty(rows, cols, dtype=f32, device=device)
        a = self.abs.view(i32)
        self.abs_row, self.abs_col = a.view(rows, cb, 16), a.view(rb, 16, cols)
        self.amax_i = torch.empty(2, m, dtype=i32, device=device)
        self.amax_row, self.amax_col = self.amax_i[0].view(rows, cb), self.amax_i[1].view(rb, cols)
        self.amax = self.amax_i.view(f32)
        self.amax_first = self.amax[0]
        self.s_b = torch.empty(2, m, dtype=f32, device=device)
        self.s_b_row, self.s_b_col = self.s_b[0].view(rows, cb, 1), self.s_b[1].view(rb, 1, cols)
        self.enc = torch.empty(2, m, dtype=f32, device=device)
        self.enc_row, self.enc_col = self.enc[0].view(rows, cb, 1), self.enc[1].view(rb, 1, cols)
        self.exp_small = torch.empty(2, m, dtype=i32, device=device)
        self.exp_small_f = self.exp_small.view(f32)
        self.top = torch.empty(2, m, dtype=f32, device=device)
        self.exp = torch.empty(2, n, dtype=i32, device=device)
        self.exp_f = self.exp.view(f32)
        # for the C kernel (precision/native.py): the block amaxes of both layouts, s_b, enc
        self.pointers = (self.amax_i[0].data_ptr(), self.amax_i[1].data_ptr(),
                         self.s_b.data_ptr(), self.enc.data_ptr())


_WORK_SHAPES = 8


def rowcol_work(rows: int, cols: int, device: torch.device) -> RowColWork:
    """The calling thread's RowColWork for this shape (the least recently used of more than
    _WORK_SHAPES shapes is dropped)."""
    cache: dict[tuple[int, int, torch.device], RowColWork] | None = getattr(_SCRATCH, "work",
                                                                              None)
    if cache is None:
        cache = _SCRATCH.work = {}
    key = (rows, cols, device)
    w = cache.pop(key, None)
    if w is None:
        w = RowColWork(rows, cols, device)
        while len(cache) >= _WORK_SHAPES:
            cache.pop(next(iter(cache)))
    cache[key] = w
    return w


# Exponent-field arithmetic on FP32 bit patterns (int32 views). The int32 constants are 0-d
# tensors: integer ops with Python-scalar operands take a slow, unvectorised path on CPU.
_EXP_MASK, _ONE_EXP = 0x7F800000, 1 << 23
# Rounding to a grid of step s by adding and subtracting C = 1.5 * 2^23 * s (the FP32 addition
# rounds to a multiple of s, the subtraction is exact): for a format with m mantissa bits,
# s = 2^(e - m) at exponent e, so C = 2^e * 1.5 * 2^(23 - m), built as a multiplier `alpha` of
# the power of two 2^e: `y.add_(p, alpha=a)` adds a * p, a product of FP32 values that is
# exact here, so the one rounding is that of y + C, with or without FMA.
_C_E2M1 = 1.5 * 2.0 ** 22
_C_E4M3 = 1.5 * 2.0 ** 20
_E4M3_MIN_NORMAL = 2.0 ** -6
_CONSTS: dict[torch.device, tuple[torch.Tensor, ...]] = {}


def _consts(device: torch.device) -> tuple[torch.Tensor, ...]:
    c = _CONSTS.get(device)
    if c is None:
        c = _CONSTS.setdefault(device, tuple(
            torch.tensor(v, dtype=torch.int32, device=device)
            for v in (_EXP_MASK, _ONE_EXP, 9 * _ONE_EXP)))
    return c


def _pow2_floor(a: torch.Tensor, lo: float, hi: float | None) -> torch.Tensor:
    """2^floor(log2 |a|) clamped to [lo, hi] (powers of two), as int32 bits (a scratch buffer).

    The masked bits (sign and mantissa cleared) are those of a power of two, +0 or +inf, so
    they are clamped as FP32 values: for non-negative floats the order of the values is the
    order of the bit patterns, and a float clamp is vectorised (an int32 clamp with tensor
    bounds is not)."""
    e = torch.bitwise_and(a.view(torch.int32), _consts(a.device)[0],
                          out=scratch("exp", a, torch.int32))
    e.view(torch.float32).clamp_(lo, hi)
    return e


def _clamped_exponent(a: torch.Tensor) -> torch.Tensor:
    """Exponent field of |a| clamped to [exp(1.0), exp(4.0)], as int32 bits (a scratch buffer)."""
    return _pow2_floor(a, 1.0, 4.0)


def _e2m1_step(a: torch.Tensor) -> torch.Tensor:
    """The E2M1 grid step at |a|: 0.5 below 2, 1 on [2, 4), 2 from 4 on (from the exponent bits)."""
    return _clamped_exponent(a).sub_(_consts(a.device)[1]).view(torch.float32)


def round_e2m1_(y: torch.Tensor) -> torch.Tensor:
    """In place: round FP32 values in [-6, 6] to the nearest E2M1 value, ties to even.

    The grid step s is 0.5 on [0, 2), 1 on [2, 4) and 2 on [4, 6]. Adding C = 1.5 * 2^23 * s
    (whose FP32 ulp is exactly s, for every y in [-6, 6]) makes the FP32 addition itself round y
    to a multiple of s with IEEE round-to-nearest-even, and subtracting C is exact. The even
    multiple of s is the even mantissa: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
    """
    e = _clamped_exponent(y).view(torch.float32)          # 2^k, k in {0, 1, 2}: s = 2^(k-1)
    return y.add_(e, alpha=_C_E2M1).sub_(e, alpha=_C_E2M1)


def round_e4m3_(v: torch.Tensor) -> torch.Tensor:
    """In place: round FP32 values in [0, 448] to the nearest float8_e4m3fn value, ties to even:
    the FP32 value of v.to(torch.float8_e4m3fn) (torch's cast, c10 fp8e4m3fn_from_fp32_value,
    rounds to nearest even, also in the subnormal range), without the cast's two passes.

    The step is 2^(e - 3) at exponent e >= -6 (3 mantissa bits) and 2^-9 below 2^-6
    (subnormals): the magic-constant addition of round_e2m1_ with e clamped below at -6. The
    even multiple of the step is the even mantissa, as in the cast; 448 (the largest finite
    value) rounds to itself, so values must be clamped to 448 first (the cast maps what rounds
    above 448 to NaN)."""
    e = _pow2_floor(v, _E4M3_MIN_NORMAL, None).view(torch.float32)
    return v.add_(e, alpha=_C_E4M3).sub_(e, alpha=_C_E4M3)


def round_e2m1(a: torch.Tensor) -> torch.Tensor:
    """RNE to E2M1 of FP32 values in [-6, 6] (out of place)."""
    return round_e2m1_(a.float().clone())


def random_bytes(n: int, generator: torch.Generator | None,
                 device: torch.device) -> torch.Tensor:
    """n uniform random bytes (uint8): full-range int32 draws viewed as bytes (4 per draw).
    The result lives in a scratch buffer: consume it before the next call."""
    words = scratch("rand", ((n + 3) // 4,), torch.int32, device)
    torch.randint(-2 ** 31, 2 ** 31, words.shape, generator=generator, out=words)
    return words.view(torch.uint8)[:n]


def stochastic_round_e2m1(y: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """In place: stochastic rounding of FP32 values in [-6, 6] with 8 random bits per element r:
    u = r/256, t = |y| + u*step(|y|), q = min(floor(t/step(t))*step(t), 6), sign of y."""
    r = random_bytes(y.numel(), generator, y.device).view(y.shape)
    a = torch.abs(y, out=scratch("abs", y, torch.float32))
    # step(|y|)/256 from the exponent bits (power of two): u*step = r * (step/256), exact
    step_256 = _clamped_exponent(a).sub_(_consts(y.device)[2]).view(torch.float32)
    t = torch.mul(r, step_256, out=scratch("sr", y, torch.float32)).add_(a)
    st = _e2m1_step(t)
    q = t.div_(st).floor_().mul_(st).clamp_(max=E2M1_MAX)
    return torch.copysign(q, y, out=y)
