"""The fused C kernel of the rowwise + columnwise NVFP4 fake quantization (rowcol.c), built at
first use with the machine's C compiler and loaded with ctypes.

Why: on the tiny CPU model the torch formulation of nvfp4.fake_quantize_rowcol is ~14 passes over
memory and ~30 ATen calls per tensor, each a parallel region at two intra-op threads; the C
kernel makes two passes, on torch's intra-op threads. It computes the same IEEE FP32 operations
in the same order (compiled without FMA contraction or fast-math), so its results are the torch
code's bits (tests/test_nvfp4_native.py compares them on every kind of input, at 1 and 2
threads). Without a compiler, or when the build fails, `kernel()` returns None and nvfp4.py
keeps the torch code (one warning says why). The library is built in a private temporary
directory, removed once loaded: nothing is written into the image or the checkout, and there is
no cache to go stale.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from .rounding import scratch

if TYPE_CHECKING:
    from .rounding import RowColWork

Encode = Callable[[int], tuple[float, float, float]]
"""The bits of max|x| -> (amax, fl32(S_enc / 6), S_dec) (nvfp4._encode_bits)."""

BLOCK = 16

SOURCE = Path(__file__).with_name("rowcol.c")
FLAGS = ["-O3", "-march=native", "-std=c99", "-fPIC", "-shared", "-ffp-contract=off",
         "-fno-fast-math", "-fno-trapping-math"]
"""No FMA contraction and no fast-math: every operation rounds as the torch code's does.
-fno-trapping-math only lets the compiler vectorise the clamps' compare-and-select (floating-point
exceptions are not observed; no value changes); -march=native: built where it runs."""

ENABLED = True
"""nvfp4 uses the kernel when it can be built (tests switch it off to compare)."""


ANNOTATION = "kernel::"
"""The prefix of the kernel's profiler annotations: profile/attribution.py's `KERNEL_PREFIX`, the
annotations whose time a profile counts as compute (a test keeps the two equal; the profile is a
higher layer, so this module names it instead of importing it)."""


def _annotated(name: str) -> contextlib.AbstractContextManager[object]:
    """A profiler annotation around one kernel call (`attribution.KERNEL_PREFIX`: the profile
    counts its time as compute; without it, as host time, for aten never sees the call); no
    annotation when no profiler runs (4 us a call, against 0.05 for the check)."""
    if torch.autograd._profiler_enabled():
        return torch.autograd.profiler.record_function(ANNOTATION + name)
    return contextlib.nullcontext()


_LOCK = threading.Lock()
_STATE: dict[str, object] = {}


class Kernel:
    """ctypes bindings of rowcol.c (pointers as integers: tensor.data_ptr())."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        i64, ptr, f32, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
        self.block_amax = lib.nvfp4_block_amax
        self.block_amax.argtypes = [ptr, i64, i64, ptr, ptr, i32]
        self.block_amax.restype = ctypes.c_uint32
        self.rowcol = lib.nvfp4_rowcol
        self.rowcol.argtypes = [ptr, i64, i64, ptr, f32, f32, ptr, ptr, ptr, i32]
        self.rowcol.restype = None
        self.row = lib.nvfp4_row
        self.row.argtypes = self.rowcol.argtypes
        self.row.restype = None


def _compiler() -> str | None:
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


def build() -> Kernel:
    """Compile rowcol.c into a temporary directory and load it; raises on any failure. With
    OpenMP when the compiler has it (gcc does; clang may lack libomp), else on one thread."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    tmp = tempfile.mkdtemp(prefix="nvfp4-rowcol-")
    try:
        lib_path = os.path.join(tmp, "rowcol.so")
        for extra in (["-fopenmp"], []):
            res = subprocess.run([cc, *FLAGS, *extra, "-o", lib_path, str(SOURCE)],
                                 capture_output=True, text=True, timeout=120)
            if res.returncode == 0:
                return Kernel(ctypes.CDLL(lib_path))
        raise RuntimeError(f"{cc} failed on {SOURCE}: {res.stderr.strip()[-400:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)   # the loaded library stays mapped


def kernel() -> Kernel | None:
    """The process's kernel, built on the first call; None when it cannot be built (warned once)."""
    if "kernel" not in _STATE:
        with _LOCK:
            if "kernel" not in _STATE:
                try:
                    _STATE["kernel"] = build()
                except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                    warnings.warn(f"NVFP4 emulation: the fused C kernel is not available ({e}); "
                                  "using the torch formulation (same results, slower)",
                                  RuntimeWarning, stacklevel=2)
                    _STATE["kernel"] = None
    return _STATE["kernel"]  # type: ignore[return-value]


def kernel_for(device: torch.device) -> Kernel | None:
    """The kernel for tensors on `device`: None off the CPU, when switched off (ENABLED) or when
    it cannot be built."""
    return kernel() if ENABLED and device.type == "cpu" else None


def rowcol(kern: Kernel, x2d: torch.Tensor, work: RowColWork, out: torch.Tensor,
           encode: Encode) -> float:
    """nvfp4.fake_quantize_rowcol's round-to-nearest case: both layouts into `out` (contiguous,
    2 * x2d.numel() FP32 values), block temporaries in `work` (rounding.RowColWork). encode:
    the bits of max|x| -> (amax, fl32(S_enc / 6), S_dec) (nvfp4: any group reduction of the
    amax, then the encode scales). Returns the amax."""
    rows, cols = x2d.shape
    xp, (amax_row, amax_col, s_b, enc) = x2d.data_ptr(), work.pointers
    nt = torch.get_num_threads()
    with _annotated("nvfp4_block_amax"):
        bits = kern.block_amax(xp, rows, cols, amax_row, amax_col, nt)
    amax, k, s_dec = encode(bits)    # outside: it may all-reduce the amax (communication)
    with _annotated("nvfp4_rowcol"):
        kern.rowcol(xp, rows, cols, amax_row, k, s_dec, s_b, enc, out.data_ptr(), nt)
    return amax


def rowwise(kern: Kernel, x2d: torch.Tensor, out_slot: str | None, encode: Encode
            ) -> tuple[torch.Tensor, float]:
    """nvfp4.fake_quantize_amax's rowwise 1x16 round-to-nearest case: (values, amax); the values
    in the scratch buffer `out_slot` if given (rounding.scratch), else a new tensor. encode: as
    for rowcol."""
    rows, cols = x2d.shape
    m, dev = rows * cols // BLOCK, x2d.device
    amax_b = scratch("native_amax", (m,), torch.int32, dev)
    s_b, enc = (scratch(slot, (m,), torch.float32, dev) for slot in ("native_s_b", "native_enc"))
    out = (scratch(out_slot, (rows, cols), torch.float32, dev) if out_slot
           else torch.empty(rows, cols, device=dev))
    xp, ap, nt = x2d.data_ptr(), amax_b.data_ptr(), torch.get_num_threads()
    with _annotated("nvfp4_block_amax"):
        bits = kern.block_amax(xp, rows, cols, ap, None, nt)
    amax, k, s_dec = encode(bits)
    with _annotated("nvfp4_row"):
        kern.row(xp, rows, cols, ap, k, s_dec, s_b.data_ptr(), enc.data_ptr(), out.data_ptr(), nt)
    return out, amax
