"""`launch env` exports the environment the GB200 NVFP4 runs converged with, every variable with
its value and a reason where it is set; JIT and compiler caches go to run.cache_dir, never into
the (read-only) image."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llama31_405b.config import load_config
from llama31_405b.config.env import cache_env, launch_env

REPO = Path(__file__).resolve().parents[1]
GB200 = sorted((REPO / "configs").glob("config_GB200_*.toml"))
BASE = REPO / "configs" / "base" / "gb200_405b.toml"

# The environment of the GB200 NVFP4 Llama 3.1 405B runs that converged in MLPerf Training v5.1
# (docs/launch.md, "Environment"), plus the NVFP4 recipe switches of the configs' "vanilla" NVFP4.
REFERENCE = {
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_MIN_NCHANNELS": "4",
    "NCCL_MIN_CTAS": "16",
    "NCCL_MAX_CTAS": "32",
    "NCCL_P2P_NET_CHUNKSIZE": "2097152",
    "NCCL_WORK_FIFO_DEPTH": "1048576",
    "NCCL_SHARP_GROUP_SIZE_THRESH": "2",
    "NCCL_GRAPH_REGISTER": "0",
    "NCCL_LOCAL_REGISTER": "0",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
    "NVTE_FWD_LAYERNORM_SM_MARGIN": "16",
    "NVTE_BWD_LAYERNORM_SM_MARGIN": "16",
    "NVTE_NORM_FWD_USE_CUDNN": "1",
    "NVTE_NORM_BWD_USE_CUDNN": "1",
    "NVTE_NVFP4_DISABLE_RHT": "1",
    "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING": "1",
    "NVTE_NVFP4_DISABLE_2D_QUANTIZATION": "1",
    "NVTE_DPA_FP8_RECIPE": "F16",
}
CACHE_VARS = ("TRITON_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR",
              "CUDA_CACHE_PATH", "MPLCONFIGDIR")


def _exported(config: Path) -> dict[str, str]:
    """What run_and_time.sh's `eval "$(launch env CONFIG)"` leaves in a shell's environment."""
    out = subprocess.run(
        ["bash", "-c", 'eval "$("$0" -m llama31_405b launch env "$1")" && env -0', sys.executable,
         str(config)], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
        check=True)
    return dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)


@pytest.mark.parametrize("config", GB200, ids=lambda p: p.stem)
def test_every_gb200_config_exports_the_reference_environment(config):
    env = launch_env(load_config(config))
    wrong = {k: (v, env.get(k)) for k, v in REFERENCE.items() if env.get(k) != v}
    assert not wrong, f"{config.name}: (reference, ours) {wrong}"


def test_launch_env_command_exports_them_through_the_shell():
    got = _exported(GB200[0])
    assert {k: got.get(k) for k in REFERENCE} == REFERENCE
    assert all(got[k].startswith("/tmp/llama31_405b-cache/") for k in CACHE_VARS)
    assert got["HOME"] == os.environ["HOME"]          # HOME is never redirected (host side)


def test_every_env_table_entry_says_why():
    """The base config's [env] values carry their reason on the same line."""
    lines = BASE.read_text().split("[env]", 1)[1].split("\n[", 1)[0].splitlines()
    entries = [ln for ln in lines if re.match(r"^[A-Z][A-Z0-9_]* = ", ln)]
    assert len(entries) == len(load_config(GB200[0]).env) >= 8
    bare = [ln for ln in entries if not re.search(r'"\s+#\s*\S', ln)]
    assert not bare, bare


def test_registration_follows_expandable_segments_and_graphs():
    cfg = GB200[0]
    no_graphs = launch_env(load_config(cfg, overrides={"performance": {"cuda_graphs": "none"}}))
    assert "NCCL_GRAPH_REGISTER" not in no_graphs and "TORCH_NCCL_AVOID_RECORD_STREAMS" not in no_graphs
    plain = launch_env(load_config(cfg, overrides={"performance": {"expandable_segments": False}}))
    assert "PYTORCH_CUDA_ALLOC_CONF" not in plain and "NCCL_LOCAL_REGISTER" not in plain
    assert plain["TORCH_NCCL_AVOID_RECORD_STREAMS"] == "1"


def test_cache_dirs_follow_run_cache_dir():
    env = launch_env(load_config(GB200[0], overrides={"run": {"cache_dir": "/scratch/c/"}}))
    assert {k: env[k] for k in CACHE_VARS} == {
        "TRITON_HOME": "/scratch/c/triton", "TRITON_CACHE_DIR": "/scratch/c/triton/cache",
        "TORCHINDUCTOR_CACHE_DIR": "/scratch/c/inductor",
        "TORCH_EXTENSIONS_DIR": "/scratch/c/torch_extensions", "CUDA_CACHE_PATH": "/scratch/c/cuda",
        "MPLCONFIGDIR": "/scratch/c/matplotlib"}
    assert not {"HOME", "XDG_CACHE_HOME", "TMPDIR"} & set(env)
    # the tiny CPU configs change nothing: no cache dir, no GPU tuning
    tiny = launch_env(load_config(REPO / "configs" / "tiny_cpu.toml"))
    assert not set(CACHE_VARS) & set(tiny) and "NCCL_MIN_CTAS" not in tiny


@pytest.mark.slow
def test_compiled_swiglu_writes_its_caches_under_cache_dir(tmp_path):
    """Megatron's fused SwiGLU (megatron-core 0.19.2 fusions.fused_bias_swiglu.swiglu, compiled by
    its jit_fuser = torch.compile) run with cache_env(DIR): Inductor's cache lands in DIR, and
    nothing is written into HOME."""
    home, cache = tmp_path / "home", tmp_path / "cache"
    home.mkdir()
    code = ("import torch\nfrom megatron.core.fusions.fused_bias_swiglu import swiglu\n"
            "print(tuple(swiglu(torch.randn(4, 16)).shape))\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1", **cache_env(str(cache))}
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0 and "(4, 8)" in p.stdout, p.stderr[-3000:]
    assert list((cache / "inductor").rglob("*.py")), "no Inductor output under cache_dir"
    assert not list(home.rglob("*")), list(home.rglob("*"))
