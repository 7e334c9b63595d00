"""Hardware as data: one TOML file per system id, read by the config validator and the planner.

Bandwidths are per GPU and unidirectional unless the field name says otherwise. A "rack" is one
NVLink domain. Where the domain spans nodes (GB200/GB300 NVL72: 72 GPUs over 18 trays), a
model-parallel group (TP x PP x CP) must fit inside one. Where it is one node (DGX/HGX 8-GPU
systems, `node_nvlink_domain`), a "rack" is a node: TP stays inside it, CP too when TP x CP fits
the node, and PP (and wider CP) spans nodes over the scale-out network (config/validate.py,
parallel/placement.py, planner/topology.py).
"""
from __future__ import annotations

import tomllib
from dataclasses import MISSING, dataclass, fields
from functools import cache
from pathlib import Path
from typing import Literal

HERE = Path(__file__).parent


@dataclass(kw_only=True, frozen=True, slots=True)
class SystemSpec:
    id: str
    """System id (the file name without .toml)."""
    name: str
    """Marketing name, used in submission_platform and systems/<system>.json."""
    accelerator: str
    """Accelerator model name."""
    peak_tflops_fp32: float
    """Dense FP32 (or TF32 for GPUs) peak per accelerator, TFLOP/s."""
    peak_tflops_bf16: float
    """Dense BF16 peak per accelerator, TFLOP/s."""
    peak_tflops_fp8: float
    """Dense FP8 peak per accelerator, TFLOP/s (0: not supported)."""
    peak_tflops_nvfp4: float
    """Dense NVFP4 peak per accelerator, TFLOP/s (0: not supported natively)."""
    nvfp4: Literal["native", "emulated", "none"]
    """How NVFP4 runs: TE kernels (native), the project's PyTorch emulation, or not at all."""
    hbm_gb: float
    """Usable device memory per accelerator, GB."""
    hbm_tbs: float
    """Device memory bandwidth, TB/s."""
    nvlink_gbs: float
    """NVLink bandwidth per GPU per direction, GB/s."""
    scaleout_gbs: float
    """Scale-out (cross-rack) network bandwidth per GPU per direction, GB/s."""
    sm_count: int
    """Streaming multiprocessors per GPU (CPU: cores); the planner's GEMM wave and NCCL SM-share
    models use it."""
    gpus_per_nvlink_domain: int
    """Accelerators in one NVLink domain (rack; on 8-GPU systems the node)."""
    gpus_used_per_rack: int
    """Accelerators a job uses per rack by default (GB200 NVL72: 16 of 18 trays = 64; 8-GPU
    systems: the node's 8)."""
    gpus_per_node: int
    """Accelerators per node (Slurm tasks per node)."""
    cpu_cores_per_node: int
    """CPU cores per node (host side)."""
    host_memory_gb: float
    """Host memory per node, GB."""
    interconnect: str
    """Scale-out network, as written in systems/<system>.json."""
    host_processor_model_name: str
    """Host CPU model (systems/<system>.json host_processor_model_name)."""
    host_processors_per_node: int
    """Host CPU sockets per node (the result summarizer multiplies it by the node count)."""
    accelerator_host_interconnect: str
    """Link between accelerator and host CPU (systems/<system>.json)."""
    cooling: str
    """Cooling of the system: liquid or air (systems/<system>.json)."""
    # How the planner's model describes the machine where it differs from a GPU (optional keys;
    # the defaults describe the GPUs: docs/planner.md, "The CPU as data").
    attention_kernel: Literal["fused", "unfused"] = "fused"
    """The attention core: a fused causal kernel (executes half the non-causal FLOPs, no score
    matrix in memory) or megatron-core's unfused attention (every score computed, masked and
    soft-maxed in memory: the full FLOPs plus passes over the scores)."""
    comm_units: int = 0
    """Compute units (SMs, cores) a running overlapped collective takes from compute; 0: the
    CTAs NCCL's DP communicators are capped at (planner ASSUMED.nccl_dp_ctas)."""
    gemm_tile_m: int = 0
    gemm_tile_n: int = 0
    """Output tile of one GEMM work unit for the wave-quantisation factor; 0: the GPU tiles of
    planner ASSUMED (128 x 256). 1 x 1: no tiles (a CPU's BLAS)."""
    shared_cores: int = 0
    """Cores every rank of a job shares (a development machine running all ranks); 0: each rank
    has its own device. With more ranks computing at once than cores, compute and host time
    stretch by the demand (planner step.breakdown)."""
    pin_ranks: bool = False
    """With `shared_cores`: each rank of a torchrun job with more local ranks than cores runs on
    one core, the ranks in blocks of neighbours (parallel/cores.py): the ranks that share a core
    share it fairly and for the whole run, rather than as the scheduler moves them (which made
    some ranks wait for their peers: docs/planner.md, "Ranks pinned to cores"), and the
    planner's core share is the ranks per core (planner step.core_share)."""
    comm_core_fraction: float = 0.0
    """With `shared_cores` and ranks not pinned: the share of its communication time a rank
    keeps a core busy (the demand model of planner step.core_share; planner
    Fitted.comm_core_fraction where a calibration of model revisions 2-9 fitted it); 0: waiting
    in a collective costs no core."""
    collective_latency_s: float = 0.0
    """Time of one collective or send beyond its bytes; 0: the planner's assumed NVLink,
    scale-out and send latencies (microseconds on GPUs). On a CPU, gloo's per-call cost with the
    ranks sharing the cores."""
    one_transport: bool = False
    """Every collective and send of a job runs over one transport with one latency and one
    bandwidth (a CPU's gloo over loopback): a profile whose collectives come in two message
    sizes (TP's per-layer all-reduces, DP's gradient buckets) then fits that latency and
    bandwidth (planner calibrate/solver.py), and every kind, measured or not, follows from them. False
    (GPUs): NVLink, the scale-out network and NCCL's protocols differ by kind: one scale per
    measured kind."""
    host_s_per_layer_pass: float = 0.0
    """Host time per layer and microbatch pass (forward or backward) with nothing running on the
    device, the prior a calibration replaces: 0 on GPUs (CUDA graphs, launches ahead of the
    kernels); on a CPU, Python between the ops."""
    host_s_per_layer_token: float = 0.0
    """Host time per layer pass that grows with the microbatch, per token of it on a rank (mbs x
    sequence / CP), added to `host_s_per_layer_pass` (a calibration fits that one with this one
    held): 0 on GPUs; on a CPU, 2-rank FP32 profiles took 0.17 ms more per pass for each
    sequence of 256 tokens (bench/host_priors.py)."""
    host_s_per_step: float = 0.0
    """Host time per step outside the layer passes, beyond the planner's assumed host work per
    step (the optimizer's gradient-norm read), stretched like the passes' where ranks share
    cores: 0 on GPUs (CUDA graphs); on a CPU, the optimizer's and the step's Python
    (bench/host_priors.py: 7.3 ms per step on 2-rank FP32 profiles, 2 of them the assumed)."""
    host_s_per_chunk_pass: float = 0.0
    """Host time per model chunk and microbatch pass (forward or backward) beyond its layers',
    the prior a calibration with a pipeline fit layout replaces (`Fitted.host_s_per_chunk_pass`):
    0 on GPUs (CUDA graphs replay the schedule); on a CPU, the pipeline schedule's Python around
    each pass and its exchanges, about 0.5 ms a pass (bench/host_where.py on the committed
    profiles, docs/planner_proof/host_where/2026-12-07T1635Z.txt; model revision 22)."""
    host_s_per_emulated_linear: float = 0.0
    """Host time of one emulated low-precision linear's autograd Function, forward or backward,
    beyond an FP32 linear's (whose Python is in `host_s_per_layer_pass`), stretched like the
    passes' where ranks share cores: where GEMMs are emulated (systems `nvfp4 = "emulated"`:
    4 linears a transformer layer, the quantisation's Python around the C kernel); 0 elsewhere
    (model revision 18)."""

    @property
    def node_nvlink_domain(self) -> bool:
        """The NVLink domain is (at most) one node: an 8-GPU DGX/HGX system, where model-parallel
        groups larger than the node span nodes over the scale-out network."""
        return self.gpus_per_nvlink_domain <= self.gpus_per_node

    @property
    def is_gpu(self) -> bool:
        """Whether the system has accelerators (the CPU system's accelerator is "none (CPU)")."""
        return not self.accelerator.lower().startswith("none")

    def peak_tflops(self, precision: str) -> float:
        """Dense peak for a compute precision name (fp32, bf16, fp8, nvfp4). Emulated NVFP4
        runs its GEMMs in FP32, so its MFU is measured against the FP32 peak."""
        if precision == "nvfp4" and self.nvfp4 == "emulated":
            return self.peak_tflops_fp32
        return {"fp32": self.peak_tflops_fp32, "bf16": self.peak_tflops_bf16,
                "fp8": self.peak_tflops_fp8, "nvfp4": self.peak_tflops_nvfp4}[precision]


def system_ids() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.toml"))


@cache
def load_system(system_id: str) -> SystemSpec:
    path = HERE / f"{system_id}.toml"
    if not path.is_file():
        raise ValueError(f"unknown system id {system_id!r}: no {path}; known: {', '.join(system_ids())}")
    with path.open("rb") as f:
        raw = tomllib.load(f)
    names = {f.name for f in fields(SystemSpec)}
    unknown = sorted(set(raw) - names)
    optional = {f.name for f in fields(SystemSpec) if f.default is not MISSING}
    missing = sorted(names - set(raw) - {"id"} - optional)
    if unknown or missing:
        raise ValueError(f"{path}: unknown keys {unknown}, missing keys {missing}")
    return SystemSpec(id=system_id, **raw)
