"""The environment of a training process, computed from the config in this one place.

The launcher exports `launch_env(cfg)`; nothing else in the project reads performance or recipe
environment variables. Transformer Engine reads its NVFP4 recipe defaults when it is imported, so
these must be in the environment before `import transformer_engine`.

Where a variable comes from:
- a config field, mapped below with its reason (performance.*, precision.*, run.cache_dir), when
  it follows from a setting of the config;
- the config's `[env]` table, merged last, for pure tuning values; each carries its reason as a
  comment where it is set (configs/base/gb200_405b.toml). docs/launch.md lists them all.
"""
from __future__ import annotations

from .schema import Config


def _flag(on: bool) -> str:
    return "1" if on else "0"


def _perf_env(cfg: Config) -> dict[str, str]:
    perf = cfg.performance
    env: dict[str, str] = {}
    if perf.cuda_device_max_connections is not None:
        # one hardware queue: kernels reach the GPU in issue order, so communication overlaps
        # computation as the schedule placed it
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(perf.cuda_device_max_connections)
    if perf.nccl_nvls_enable is not None:
        env["NCCL_NVLS_ENABLE"] = _flag(perf.nccl_nvls_enable)   # NVLink SHARP on/off
    if perf.nccl_min_ctas is not None:
        env["NCCL_MIN_CTAS"] = str(perf.nccl_min_ctas)          # CTAs (SMs) per NCCL kernel, floor
    if perf.nccl_max_ctas is not None:
        env["NCCL_MAX_CTAS"] = str(perf.nccl_max_ctas)          # and ceiling, left to compute
    if perf.expandable_segments:
        # the caching allocator grows mapped segments instead of fixed blocks: less fragmentation
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        if perf.cuda_graphs != "none":
            # NCCL's user-buffer registration (of graph-captured and of local buffers) off: the
            # GB200 setting for expandable segments together with CUDA graphs (docs/launch.md)
            env["NCCL_GRAPH_REGISTER"] = "0"
            env["NCCL_LOCAL_REGISTER"] = "0"
    if perf.cuda_graphs != "none":
        # ProcessGroupNCCL stashes collective inputs until the wait instead of recordStream,
        # which defers the caching allocator's frees: the GB200 setting with CUDA graphs
        env["TORCH_NCCL_AVOID_RECORD_STREAMS"] = "1"
    return env


def _recipe_env(cfg: Config) -> dict[str, str]:
    pr = cfg.precision
    env: dict[str, str] = {}
    if pr.compute == "nvfp4":
        # TE's NVFP4BlockScaling reads these "disable" switches at import time
        env["NVTE_NVFP4_DISABLE_RHT"] = _flag(not pr.nvfp4_rht)
        env["NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING"] = _flag(not pr.nvfp4_stochastic_rounding)
        env["NVTE_NVFP4_DISABLE_2D_QUANTIZATION"] = _flag(not pr.nvfp4_2d_weights)
    if pr.compute in ("fp8", "nvfp4") and pr.attention != "fp8":
        env["NVTE_DPA_FP8_RECIPE"] = "F16"   # attention stays in high precision
    elif pr.compute == "nvfp4":
        # TE has no NVFP4 attention: FP8 attention under an NVFP4 autocast takes a current-scaling
        # FP8 recipe (QKV, O, dO, dQKV; delayed scaling for S, dP) in the hybrid format (TE 2.20.2
        # dot_product_attention.py, its table of linear x attention recipes)
        env["NVTE_DPA_FP8_RECIPE"] = "Float8CurrentScaling"
        env["NVTE_DPA_FP8_FORMAT"] = "HYBRID"
    return env


def cache_env(cache_dir: str | None) -> dict[str, str]:
    """JIT and compiler caches under `cache_dir`, so that nothing writes into a read-only image
    (run_and_time.sh also makes the container writable). HOME and XDG_CACHE_HOME are left alone:
    the batch script exports launch_env on the host too, where Slurm and enroot read them."""
    if not cache_dir:
        return {}
    root = cache_dir.rstrip("/")
    return {
        # Triton kernels: TE's Triton kernels and torch.compile's (Triton defaults to ~/.triton)
        "TRITON_HOME": f"{root}/triton",
        "TRITON_CACHE_DIR": f"{root}/triton/cache",
        # torch.compile: Megatron's jit_fuser (fused SwiGLU, ...) and TE's jit are torch.compile
        "TORCHINDUCTOR_CACHE_DIR": f"{root}/inductor",
        # C++/CUDA extensions that torch builds at run time (default ~/.cache/torch_extensions)
        "TORCH_EXTENSIONS_DIR": f"{root}/torch_extensions",
        # the CUDA driver's cache of PTX compiled for this GPU (default ~/.nv/ComputeCache)
        "CUDA_CACHE_PATH": f"{root}/cuda",
        # matplotlib's config and font cache (default ~/.config/matplotlib)
        "MPLCONFIGDIR": f"{root}/matplotlib",
    }


def launch_env(cfg: Config) -> dict[str, str]:
    env = {**_perf_env(cfg), **_recipe_env(cfg), **cache_env(cfg.run.cache_dir)}
    env.update(cfg.env)                      # the config's [env] table wins
    return env


def env_mismatches(cfg: Config, environ) -> list[str]:
    """The variables of `launch_env(cfg)` that `environ` lacks or holds with another value, one
    line each. A GPU rank started without them (srun by hand, or a container image whose own value
    wins over the host's) would silently run another NVFP4 recipe or NCCL setting."""
    out = []
    for name, want in sorted(launch_env(cfg).items()):
        have = environ.get(name)
        if have != want:
            out.append(f"{name}={want} expected, " + ("unset" if have is None else f"found {have!r}"))
    return out
