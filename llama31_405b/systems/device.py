"""Where a config's code runs: the one decision, taken from the system file and checked against
what this process sees.

    dev = decide(cfg)          # raises DeviceError before any expensive work
    dev.gpu                    # True: CUDA (NCCL, Transformer Engine); False: CPU (gloo)

- A GPU system (`SystemSpec.is_gpu`) runs on CUDA; a process that sees no CUDA device is
  refused with a message naming the config and the system (a GB200 config started on a login
  node, a container without `--gpus`, CUDA_VISIBLE_DEVICES emptied).
- The `cpu` system runs on the CPU even where a GPU is visible: a tiny config on a GPU node runs
  as configured (gloo, Megatron's local layers, the NVFP4 emulation), never Transformer Engine's
  native NVFP4.

Only code that runs a model asks (`train`, checkpoint conversion, the first-contact check);
`config check`, `precheck` and `plan` read the system file alone and work anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import load_system


class DeviceError(RuntimeError):
    """The config's system needs hardware this process does not see."""


@dataclass(frozen=True, slots=True)
class Device:
    gpu: bool
    """Compute on CUDA (True) or on the CPU (False)."""
    system: str
    """The config's system id."""
    cuda_visible: bool
    """Whether this process sees a CUDA device (it may, and still run on the CPU)."""

    @property
    def kind(self) -> str:
        """torch device type: "cuda" or "cpu"."""
        return "cuda" if self.gpu else "cpu"

    @property
    def backend(self) -> str:
        """torch.distributed backend."""
        return "nccl" if self.gpu else "gloo"


CPU = Device(gpu=False, system="cpu", cuda_visible=False)
"""The CPU, for config-level inspection (tests, the converter) that never touches a GPU."""


def cuda_visible() -> bool:
    """Whether this process sees a CUDA device (the only place the project asks torch)."""
    import torch
    return torch.cuda.is_available()


def decide(cfg, *, cuda_available: bool | None = None) -> Device:
    """The device `cfg` runs on in this process; DeviceError when its GPU system meets a process
    without CUDA. `cuda_available` overrides what the process sees (tests)."""
    spec = load_system(cfg.system.id)
    seen = cuda_visible() if cuda_available is None else cuda_available
    if spec.is_gpu and not seen:
        raise DeviceError(
            f"{cfg.source or '<config>'}: system {spec.id!r} ({spec.accelerator}) runs on GPUs, "
            "but this process sees no CUDA device (torch.cuda.is_available() is False). Start "
            "it on a GPU node inside the project's container (Slurm: run_and_time.sh), or use a "
            "config with system.id = \"cpu\" (configs/tiny_cpu.toml). `config check`, "
            "`compliance precheck` and `plan` work without a GPU.")
    return Device(gpu=spec.is_gpu, system=spec.id, cuda_visible=seen)
