"""Does the slice fit? First contact estimates the memory of the slice (and of the DP 2 phase's
ranks) before anything is built and, when it cannot fit, reports the phase's first check failed,
naming the estimate, the memory available and the configs whose slice would fit, instead of
being killed by the kernel's out-of-memory killer with no message (`first-contact --cpu` on the
default GB200 config: a one-layer slice of 7.39 B parameters with the 128,256-row vocabulary).

The estimate, per rank, in bytes:

- training state: the planner's memory model (`planner.memory.memory` on the slice's own config,
  TP = PP = CP = 1): the weights as stored plus the quantized copies Transformer Engine's GEMMs
  read, the gradient buffers, FP32 master weights and Adam's two moments (sharded over DP by the
  distributed optimizer);
- activations: the planner's (every layer of one microbatch with fused attention, and the
  logits) plus its fragmentation allowance; without Transformer Engine, Megatron's local
  attention also materialises every head's S x S scores, LOCAL_SCORE_BYTES each at once
  (slice.LOCAL_SEQ_LENGTH), counted for every layer; on a GPU all of it twice: the
  full-iteration graph's memory pool and an eager pass beside it (check replay_equals_eager);
- reserve: on a GPU the planner's (CUDA context, NCCL, workspaces); on the CPU PROCESS_BYTES,
  the process itself (Python with torch and megatron-core imported);
- host copies: the warm-up's restore point keeps the FP32 master weights on the host
  (train.warmup), and the slice phase keeps two host copies of the parameters in their own dtype
  (as built and as loaded: the bitwise comparisons).

The planner's total is not used as it stands: its reserve is a GPU's and its activations assume
the fused attention; everything else is its model. On the CPU all of it is host memory; on a GPU
the first three are the GPU's and the copies the host's. Available now: the host's MemAvailable
(/proc/meminfo), lowered to a cgroup's memory limit less its usage where one is set; a GPU's
free memory (torch.cuda.mem_get_info) plus what this process's caching allocator holds unused.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from .slice import LOCAL_SEQ_LENGTH, REPO, choose_recipe, local_compute, slice_config

if TYPE_CHECKING:
    from ..config.schema import Config
    from .report import Report

EstimateOf: TypeAlias = Callable[["Config"], "Estimate | None"]
"""The Estimate of a loaded config's slice on this machine (None: no slice here)."""

GIB = 2**30
LOCAL_SCORE_BYTES = 10.0
"""Bytes per attention score live at once in Megatron's local attention (slice.LOCAL_SEQ_LENGTH:
BF16 scores, the FP32 softmax and its output)."""
PROCESS_BYTES = 2 * GIB
"""The first-contact process itself on the CPU (Python, torch, megatron-core and the project
imported; about 1 GiB resident on the tiny configs), rounded up."""
SLICE_HOST_COPIES = 2
"""Host copies of the parameters the slice phase keeps (checks._run_slice: as built, as loaded)."""
CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                 "/sys/fs/cgroup/memory/memory.usage_in_bytes"))
"""cgroup v2, then v1: (limit, usage) of this process's memory cgroup, where one is mounted."""


@dataclass(frozen=True)
class Estimate:
    """One rank's memory, in bytes (module docstring)."""
    parameters: float
    state: float
    activations: float
    reserve: float
    host_copies: float
    gpu: bool

    @property
    def device(self) -> float:
        return self.state + self.activations + self.reserve

    def needs(self, ranks: int = 1) -> dict[str, float]:
        """Bytes per memory for `ranks` ranks on one host, each with its own GPU on a GPU."""
        if self.gpu:
            return {"gpu": self.device, "host": ranks * self.host_copies}
        return {"host": ranks * (self.device + self.host_copies)}

    def parts(self) -> str:
        r = "CUDA context and workspaces" if self.gpu else "the process"
        return (f"{self.parameters / 1e9:.2f} B parameters: training state "
                f"{self.state / GIB:.1f} GiB, activations {self.activations / GIB:.1f}, "
                f"{r} {self.reserve / GIB:.1f}, host copies {self.host_copies / GIB:.1f}")


def estimate(scfg: Config, *, te: bool, gpu: bool, host_copies: int = SLICE_HOST_COPIES
             ) -> Estimate:
    """The memory of one rank of the slice config `scfg` (slice.slice_config)."""
    from ..planner.calibrate.constants import ASSUMED
    from ..planner.context import Context
    from ..planner.memory import GB, memory
    ctx = Context.of(scfg)
    mem = memory(ctx)
    m = scfg.model
    act = (mem.activations_gb + mem.fragmentation_gb) * GB
    if not te:   # the local attention's scores, every head, S x S per microbatch and layer
        scores = (m.num_layers * scfg.batch.micro_batch_size * m.num_attention_heads
                  * float(m.seq_length) ** 2 * LOCAL_SCORE_BYTES)
        act += scores * (1 + ASSUMED.activation_fragmentation)
    if gpu:
        act *= 2
    params = ctx.params_per_gpu
    shards = ctx.dp * ctx.cp if scfg.optimizer.distributed else 1
    stored = 4.0 if scfg.precision.params == "fp32" else 2.0
    return Estimate(parameters=params,
                    state=(mem.weights_gb + mem.grads_gb + mem.optimizer_gb) * GB,
                    activations=act, reserve=mem.reserved_gb * GB if gpu else PROCESS_BYTES,
                    host_copies=params * (4.0 / shards + stored * host_copies), gpu=gpu)


def host_available() -> int:
    """Bytes the host can give now: MemAvailable, lowered to a cgroup limit less its usage."""
    avail = None
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
    if avail is None:
        raise RuntimeError("/proc/meminfo has no MemAvailable line")
    for limit_file, usage_file in CGROUP_FILES:
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:     # "max" / v1's huge value: no limit
            avail = min(avail, max(int(limit) - usage, 0))
        break
    return avail


def gpu_available(index: int = 0) -> int:
    """Bytes a GPU can give this process now: free, plus its caching allocator's unused."""
    import torch
    free, _ = torch.cuda.mem_get_info(index)
    return int(free + torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index))


def available(gpu: bool, gpus: int = 1) -> dict[str, int]:
    """Bytes available per memory ("gpu": the smallest of the first `gpus` GPUs)."""
    out = {"host": host_available()}
    if gpu:
        out["gpu"] = min(gpu_available(i) for i in range(gpus))
    return out


def shortfalls(est: Estimate, have: dict[str, int], ranks: int = 1
               ) -> dict[str, tuple[float, int]]:
    """{memory: (bytes needed, bytes available)} for each memory that cannot hold `ranks` ranks."""
    return {k: (need, have[k]) for k, need in est.needs(ranks).items() if need > have[k]}


def fitting_configs(estimate_of: EstimateOf, have: dict[str, int], ranks: int = 1,
                    folder: Path = REPO / "configs") -> list[str]:
    """The configs of `folder` whose slice fits `have`: `estimate_of(cfg)` gives the Estimate of
    a loaded config's slice (None: no slice on this machine)."""
    from ..config import load_config
    out = []
    for path in sorted(folder.glob("*.toml")):
        try:
            est = estimate_of(load_config(path, validate=False))
        except Exception:      # a config that does not load or slice is no candidate
            continue
        if est is not None and not shortfalls(est, have, ranks):
            out.append(str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path))
    return out


def refusal(what: str, est: Estimate, have: dict[str, int], fitting: list[str],
            ranks: int = 1) -> str:
    """The failed check's detail: the estimate, the memory available, the configs that fit."""
    short = shortfalls(est, have, ranks)
    where = {"gpu": "GPU memory" + (" per GPU" if ranks > 1 else ""), "host": "host memory"}
    per = "" if ranks == 1 else (f"{ranks} ranks, one per GPU, each " if est.gpu else
                                 f"{ranks} ranks on this host, each ")
    return ("refused before building: " + "; ".join(
        f"{what} needs about {need / GIB:.1f} GiB of {where[k]}, {got / GIB:.1f} GiB available"
        for k, (need, got) in short.items())
        + f" ({per}{est.parts()}); configs that fit: "
        + (", ".join(fitting) if fitting else "none"))


def fit_data(est: Estimate, have: dict[str, int], ranks: int = 1) -> dict[str, dict[str, float]]:
    """The estimate and what was available, for the report's figures."""
    return {"memory_estimate_gib": {k: round(v / GIB, 2) for k, v in est.needs(ranks).items()},
            "memory_available_gib": {k: round(v / GIB, 2) for k, v in have.items()},
            "memory_estimate_parts_gib": {
                f.name: round(getattr(est, f.name) / GIB, 2) for f in dataclasses.fields(est)
                if f.name not in ("parameters", "gpu")}}


def slice_estimate(c: Config, *, te: bool, cpu: bool, cap: tuple[int, int] | None, layers: int,
                   seq_length: int | None, steps: int, system: str | None, dp: int = 1
                   ) -> Estimate | None:
    """The Estimate of config `c`'s slice as checks.run_checks runs it on this machine (at DP 2
    as the dp2 phase's ranks do: distributed optimizer, no host copies); None: no slice here."""
    compute = choose_recipe(c.precision.compute, cap)[0] if te else local_compute(
        c.precision.compute)
    if compute is None:
        return None
    seq = seq_length or (c.model.seq_length if te else min(c.model.seq_length, LOCAL_SEQ_LENGTH))
    s = slice_config(c, compute=compute, layers=layers, seq_length=seq, steps=steps,
                     system=system, ckpt_dir="", gaf=False, dp=dp, graphs=not cpu,
                     keep_width=not cpu)
    if dp > 1:
        s = dataclasses.replace(s, optimizer=dataclasses.replace(s.optimizer, distributed=True))
    return estimate(s, te=te, gpu=not cpu, host_copies=SLICE_HOST_COPIES if dp == 1 else 0)


def fits(rep: Report, check: str, what: str, estimate_of: EstimateOf, cfg: Config, *, gpu: bool,
         ranks: int = 1) -> bool:
    """Whether `what` fits this machine's memory now (module fit), estimated before anything is
    built: the estimate and the memory available go into `check`'s figures; when it cannot fit,
    `check` fails naming both and the configs whose slice fits. Two GPUs for the DP 2 phase on
    a GPU (with fewer, the phase says so itself); its CPU ranks share the host."""
    gpus = 1
    if gpu and ranks > 1:
        import torch
        gpus = torch.cuda.device_count()
        if gpus < ranks:
            return True
    est = estimate_of(cfg)
    if est is None:
        return True
    have = available(gpu, gpus)
    data = fit_data(est, have, ranks)
    if not shortfalls(est, have, ranks):
        rep.checks[check].data.update(data)
        rep.save()
        return True
    fitting = fitting_configs(estimate_of, have, ranks)
    rep.failed(check, refusal(what, est, have, fitting, ranks), fitting_configs=fitting,
               **data)
    return False
