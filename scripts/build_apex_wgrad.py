#!/usr/bin/env python3
"""Build Apex's `fused_weight_gradient_mlp_cuda` alone, as a wheel, from an Apex source checkout.

Megatron's gradient-accumulation fusion (on in the GB200 configs) accumulates weight gradients
straight into the FP32 main-gradient buffers; Megatron's own linear layers (the output layer
among them) do it with this Apex extension, and ColumnParallelLinear refuses the flag when it is
missing (megatron-core 0.19.2, tensor_parallel.layers).
The Dockerfile runs this script only when the base image lacks the module. Only this extension is
compiled: Apex's full `--cuda_ext` build compiles dozens of others and adds fixed `-gencode`
flags for old GPUs that newer CUDA toolkits no longer accept; here the architectures are the ones
the image's torch was built for (TORCH_CUDA_ARCH_LIST, set by NGC images).

usage: python scripts/build_apex_wgrad.py APEX_DIR WHEEL_DIR
"""
from __future__ import annotations

import sys
from pathlib import Path

MODULE = "fused_weight_gradient_mlp_cuda"
SOURCES = ("csrc/megatron/fused_weight_gradient_dense.cpp",
           "csrc/megatron/fused_weight_gradient_dense_cuda.cu",
           "csrc/megatron/fused_weight_gradient_dense_16bit_prec_cuda.cu")
# as Apex's setup.py compiles its CUDA extensions (macros for torch >= 1.5, half operators on)
MACROS = ["-DVERSION_GE_1_1", "-DVERSION_GE_1_3", "-DVERSION_GE_1_5"]
NVCC_FLAGS = ["-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
              "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math"]


def sources(apex_dir: Path) -> list[Path]:
    """The extension's sources in `apex_dir`; SystemExit naming what is missing."""
    missing = [s for s in SOURCES if not (apex_dir / s).is_file()]
    if missing:
        raise SystemExit(f"{apex_dir}: not an Apex source checkout with {MODULE}'s sources "
                         f"(missing {', '.join(missing)}); check APEX_REF")
    return [apex_dir / s for s in SOURCES]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit(__doc__.rsplit("usage: ", 1)[1].strip())
    apex_dir, wheel_dir = Path(argv[0]).resolve(), Path(argv[1]).resolve()
    srcs = sources(apex_dir)
    import os
    import tempfile

    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension
    ext = CUDAExtension(
        name=MODULE, sources=[str(s) for s in srcs], include_dirs=[str(apex_dir / "csrc")],
        libraries=["cublas"],
        extra_compile_args={"cxx": ["-O3", *MACROS], "nvcc": [*NVCC_FLAGS, *MACROS]})
    with tempfile.TemporaryDirectory(prefix="apex-wgrad-build-") as work:
        os.chdir(work)          # build/ and *.egg-info go here, not into the image's WORKDIR
        setup(name="apex-fused-weight-gradient-mlp", version="0.0.0", ext_modules=[ext],
              cmdclass={"build_ext": BuildExtension}, py_modules=[],
              script_args=["bdist_wheel", "--dist-dir", str(wheel_dir)])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
