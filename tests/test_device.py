"""Where code runs: one decision (llama31_405b.systems.device.decide) from the config's system,
checked against what the process sees. A `cpu` config runs on the CPU even where a GPU is
visible; a GPU config is refused without a GPU, before anything expensive; config-level
commands keep working on the CPU."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llama31_405b.config import load_config
from llama31_405b.systems import device as device_mod
from llama31_405b.systems.device import CPU, DeviceError, decide

from conftest import py_env

REPO = Path(__file__).resolve().parents[1]
GB200 = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"
TINY = REPO / "configs" / "tiny_cpu.toml"


def test_the_system_decides_and_the_process_is_checked():
    gb200, tiny = load_config(GB200), load_config(TINY)
    on_gpu = decide(gb200, cuda_available=True)
    assert on_gpu.gpu and on_gpu.kind == "cuda" and on_gpu.backend == "nccl"
    # a cpu config on a machine with GPUs runs as configured
    cpu = decide(tiny, cuda_available=True)
    assert not cpu.gpu and cpu.cuda_visible and cpu.backend == "gloo"
    assert not decide(tiny, cuda_available=False).gpu
    with pytest.raises(DeviceError) as e:
        decide(gb200, cuda_available=False)
    msg = str(e.value)
    assert str(GB200) in msg and "gb200-nvl72" in msg and "no CUDA device" in msg


def test_what_the_process_sees_comes_from_torch(monkeypatch):
    gb200 = load_config(GB200)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert decide(gb200).gpu
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError):
        decide(gb200)


def test_builder_reads_the_decision(monkeypatch):
    from llama31_405b.model.builder import transformer_config
    gb200 = load_config(GB200)
    monkeypatch.setattr(device_mod, "cuda_visible", lambda: False)
    with pytest.raises(DeviceError):
        transformer_config(gb200)
    t = transformer_config(gb200, device=CPU)             # config-level inspection
    assert t.use_cpu_initialization and not t.gradient_accumulation_fusion


def test_gpu_config_train_without_gpu_is_refused_before_any_work(tmp_path):
    r = subprocess.run([sys.executable, "-m", "llama31_405b", "train", "--config", str(GB200),
                        "--log", str(tmp_path / "log.txt")], cwd=REPO, env=py_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "sees no CUDA device" in r.stderr and "gb200-nvl72" in r.stderr
    assert "megatron" not in r.stderr.lower()              # refused before Megatron loads
    assert not (tmp_path / "log.txt").exists()              # no MLPerf log begun


def test_config_level_commands_work_without_a_gpu():
    r = subprocess.run([sys.executable, "-m", "llama31_405b", "config", "check", str(GB200)],
                       cwd=REPO, env=py_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


CPU_ON_GPU = r"""
import sys, torch
torch.cuda.is_available = lambda: True          # a machine whose GPUs are visible
from llama31_405b.config import load_config
from llama31_405b.parallel.setup import setup_parallel, teardown_parallel
from llama31_405b.model.builder import build_model
cfg = load_config(sys.argv[1])
info = setup_parallel(cfg)
assert not info.device.gpu and info.backend == "gloo", info
assert not torch.cuda.is_available()            # Megatron's own checks take the CPU branch
# with Transformer Engine installed, megatron's default final norm is TE's (a GPU module)
import megatron.core.transformer.transformer_block as block
class TENormStandIn:
    def __init__(self, *a, **k):
        raise RuntimeError("a Transformer Engine norm in a CPU model")
block.LayerNormImpl = TENormStandIn
chunks = build_model(cfg)
params = {str(p.device) for c in chunks for p in c.parameters()}
emulated = sum(hasattr(m, "nvfp4_recipe") for c in chunks for m in c.modules())
norm = type(chunks[0].decoder.final_layernorm)
norm = f"{norm.__module__}.{norm.__name__}"
teardown_parallel()
print(sorted(params), emulated, norm)
"""


@pytest.mark.slow
def test_cpu_config_on_a_gpu_machine_runs_on_the_cpu_with_nvfp4_emulation(tmp_path):
    script = tmp_path / "cpu_on_gpu.py"
    script.write_text(CPU_ON_GPU)
    r = subprocess.run([sys.executable, str(script), str(REPO / "configs" / "tiny_cpu_nvfp4.toml")],
                       cwd=REPO, env=py_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    params, emulated, norm = r.stdout.strip().splitlines()[-1].rsplit(" ", 2)
    assert params == "['cpu']" and int(emulated) > 0 and norm == "torch.nn.modules.normalization.RMSNorm"
