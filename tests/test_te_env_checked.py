"""Which runs check Transformer Engine's environment before TE is imported (train.loop
te_env_checked -> precision.te_recipe.require_te_env): every GPU run with TE's layers, BF16
included, since TE's kernel choices (attention backend, cuDNN norms) are read in BF16 too; never
a CPU run. No GPU here: the decision is tested, and the init's use of it with the device
decision and the check itself standing in (the check is tested in tests/test_te_kernel_env.py)."""
import dataclasses
from pathlib import Path

import pytest

from llama31_405b.config import load_config
from llama31_405b.systems.device import CPU, Device
from llama31_405b.train.loop import Run, te_env_checked

ROOT = Path(__file__).resolve().parents[1]
GB200 = ROOT / "configs" / "config_GB200_512x4x32xtp4pp8cp2.toml"
GPU = Device(gpu=True, system="gb200-nvl72", cuda_visible=True)


def _compute(cfg, compute: str):
    return dataclasses.replace(cfg, precision=dataclasses.replace(cfg.precision, compute=compute))


def test_a_bf16_gpu_run_with_transformer_engine_checks_its_environment():
    bf16 = _compute(load_config(GB200), "bf16")
    assert te_env_checked(bf16, GPU, te_installed=True)
    # without TE a BF16 GPU run uses Megatron's local layers: TE reads nothing
    assert not te_env_checked(bf16, GPU, te_installed=False)


@pytest.mark.parametrize("compute", ["fp8", "nvfp4"])
def test_a_quantized_gpu_run_always_checks_and_a_cpu_run_never(compute):
    cfg = _compute(load_config(GB200), compute)
    assert te_env_checked(cfg, GPU, te_installed=True)
    assert te_env_checked(cfg, GPU, te_installed=False)   # model.builder refuses it later
    for te in (True, False, None):
        assert not te_env_checked(cfg, CPU, te_installed=te)
        assert not te_env_checked(_compute(cfg, "bf16"), CPU, te_installed=te)


def test_the_init_of_a_bf16_gpu_run_checks_first(monkeypatch):
    """Run._init asks te_env_checked with the device it decided, and checks before anything
    else (before the first megatron import)."""
    import llama31_405b.systems.device as device
    from llama31_405b.model import builder
    from llama31_405b.precision import te_recipe

    class Checked(Exception):
        pass

    def check(cfg, environ=None):
        raise Checked(cfg.precision.compute)

    monkeypatch.setattr(device, "decide", lambda cfg: GPU)
    monkeypatch.setattr(builder, "_has_module", lambda name: name == "transformer_engine")
    monkeypatch.setattr(te_recipe, "require_te_env", check)
    run = Run(_compute(load_config(GB200), "bf16"), seed=1, hooks=[])
    with pytest.raises(Checked, match="bf16"):
        run._init()
