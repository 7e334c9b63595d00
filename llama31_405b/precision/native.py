"""The fused C kernel of the rowwise + columnwise NVFP4 fake quantization (rowcol.c), built at
first use with the machine's C compiler and loaded with ctypes.

Why: on the tiny CPU model the torch formulation of nvfp4.fake_quantize_rowcol is ~14 passes over
memory and ~30 ATen calls per tensor, each a parallel region at two intra-op threads; the C
kernel makes two passes, on one thread. It computes the same IEEE FP32 operations in the same
order (compiled without FMA contraction or fast-math), so its results are the torch code's bits
(tests/test_nvfp4_native.py compares them on every kind of input). Without a compiler, or when
the build fails, `kernel()` returns None and nvfp4.py keeps the torch code (one warning says
why). The library is built in a private temporary directory, removed once loaded: nothing is
written into the image or the checkout, and there is no cache to go stale.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

SOURCE = Path(__file__).with_name("rowcol.c")
FLAGS = ["-O3", "-march=native", "-std=c99", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
         "-fno-trapping-math"]
"""No FMA contraction and no fast-math: every operation rounds as the torch code's does."""

ENABLED = True
"""nvfp4.fake_quantize_rowcol uses the kernel when it can be built (tests switch it off to compare)."""

_LOCK = threading.Lock()
_STATE: dict[str, object] = {}


class Kernel:
    """ctypes bindings of rowcol.c (pointers as integers: tensor.data_ptr())."""

    def __init__(self, lib: ctypes.CDLL):
        i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
        self.block_amax = lib.nvfp4_block_amax
        self.block_amax.argtypes = [ptr, i64, i64, ptr, ptr]
        self.block_amax.restype = ctypes.c_uint32
        self.rowcol = lib.nvfp4_rowcol
        self.rowcol.argtypes = [ptr, i64, i64, ptr, f32, f32, ptr, ptr, ptr]
        self.rowcol.restype = None


def _compiler() -> str | None:
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


def build() -> Kernel:
    """Compile rowcol.c into a temporary directory and load it; raises on any failure."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    tmp = tempfile.mkdtemp(prefix="nvfp4-rowcol-")
    try:
        lib_path = os.path.join(tmp, "rowcol.so")
        res = subprocess.run([cc, *FLAGS, "-o", lib_path, str(SOURCE)],
                             capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"{cc} failed on {SOURCE}: {res.stderr.strip()[-400:]}")
        return Kernel(ctypes.CDLL(lib_path))
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
