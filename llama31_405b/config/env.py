"""The environment of a training process, computed from the config in this one place.

The launcher exports `launch_env(cfg)`; nothing else in the project reads performance or recipe
environment variables. Transformer Engine reads its NVFP4 recipe defaults when it is imported, so
these must be in the environment before `import transformer_engine`.
"""
from __future__ import annotations

from .schema import Config


def _flag(on: bool) -> str:
    return "1" if on else "0"


def launch_env(cfg: Config) -> dict[str, str]:
    perf, pr = cfg.performance, cfg.precision
    env: dict[str, str] = {}
    if perf.cuda_device_max_connections is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(perf.cuda_device_max_connections)
    if perf.nccl_nvls_enable is not None:
        env["NCCL_NVLS_ENABLE"] = _flag(perf.nccl_nvls_enable)
    if perf.nccl_min_ctas is not None:
        env["NCCL_MIN_CTAS"] = str(perf.nccl_min_ctas)
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
