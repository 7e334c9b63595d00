"""What first-contact runs: the recipe the GPU in hand supports, the small slice of a config
(one layer at 405B width, one rank or DP 2), synthetic tokens, and bitwise weight comparisons."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar, cast

if TYPE_CHECKING:   # torch, megatron-core and the training loop are imported where they are used
    import torch
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer

    from ..config.schema import Config
    from ..train.loop import Run

_P = ParamSpec("_P")
_R = TypeVar("_R")

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"
TE_SERIES = "2.20"
VOCAB = 32768
NVFP4_CAPABILITY, FP8_CAPABILITY = (10, 0), (8, 9)
LOCAL_SEQ_LENGTH = 2048
"""Default sequence length of the slice on Megatron's local layers (no Transformer Engine): the
local attention materialises the scores of all 128 heads, S x S each, and its softmax runs in
FP32 (TransformerConfig.attention_softmax_in_fp32, megatron-core 0.19.2
FusedScaleMaskSoftmax.forward_torch_softmax): about 10 bytes per score live at once, 5.4 GB
at 2048 and 21 GB at 4096 per copy; next to the 64 GiB of training state, the full-iteration
graph's memory pool and an eager pass beside it, 4096 would leave no margin on one H200."""
SLICE_LR = 3e-4
"""The slice's learning rate, constant (open division: optimizer.lr/end_lr, warmup and decay 0).
The rules' schedule at the slice's GBS of 2 has a 4.6-million-step warm-up: its first update
uses an LR of ~3e-14, which moves no BF16 weight (the `steps` check needs them to move, and
the DP 2 phase needs updates that make stale weights visible)."""
LOSS_RTOL = 2.0 ** -20
"""Tolerance of replay against eager where they are not bitwise equal: relative difference of
the (FP32-accumulated, float64-summed) losses. Well above FP32 summation-order noise over a few
thousand tokens, far below BF16 resolution (2^-8), so any difference of weights shows."""
GRAD_RTOL = 2.0 ** -7
"""Gradients (BF16 buffer): max |replay - eager| <= one BF16 rounding step of the largest."""
# planner system file of the GPU in hand (placement checks and peak numbers follow it)
_SYSTEM_OF_GPU = (("GB300", "gb300-nvl72"), ("GB200", "gb200-nvl72"), ("H200", "h200-sxm"),
                  ("H100", "h100-sxm"))


def system_of_gpu(name: str) -> str | None:
    return next((s for key, s in _SYSTEM_OF_GPU if key in name.upper()), None)


def choose_recipe(configured: str, capability: tuple[int, int] | None) -> tuple[str | None, str]:
    """(compute precision to run, why). None: no quantized recipe on this GPU."""
    if capability is None:
        return None, "no CUDA device visible"
    cc = f"{capability[0]}.{capability[1]}"
    if configured == "nvfp4":
        if capability >= NVFP4_CAPABILITY:
            return "nvfp4", f"the configured NVFP4 recipe (compute capability {cc})"
        if capability >= FP8_CAPABILITY:
            return "fp8", (f"FP8 instead of the configured NVFP4: no NVFP4 hardware (compute "
                           f"capability {cc} < 10.0)")
        return None, f"no NVFP4 or FP8 hardware (compute capability {cc} < 8.9)"
    if configured == "fp8":
        if capability >= FP8_CAPABILITY:
            return "fp8", f"the configured FP8 recipe (compute capability {cc})"
        return None, f"no FP8 hardware (compute capability {cc} < 8.9)"
    return configured, f"the configured {configured} compute (no quantized recipe)"


def local_compute(configured: str) -> str:
    """The slice's compute without Transformer Engine: BF16 for a quantized recipe (the GPU
    path of Megatron's local layers), the configured precision otherwise."""
    return "bf16" if configured in ("fp8", "nvfp4") else configured


def slice_config(cfg: Config, *, compute: str, layers: int, seq_length: int, steps: int,
                 system: str | None, ckpt_dir: str, gaf: bool, dp: int = 1,
                 graphs: bool = True, keep_width: bool = True) -> Config:
    """The slice of `cfg` (package docstring): TP = PP = CP = 1 on `dp` ranks of one rack,
    MiniBS 2 of MBS 1, a 32,768-row vocabulary, `layers` layers at the config's width,
    full-iteration CUDA graphs (`graphs`; False on the CPU), a constant LR (SLICE_LR).
    `keep_width=False` keeps the config's vocabulary too (tiny CPU configs)."""
    r = dataclasses.replace
    pr = cfg.precision
    nvfp4 = compute == "nvfp4"
    vocab = VOCAB if keep_width else cfg.model.vocab_size
    return r(
        cfg,
        model=r(cfg.model, num_layers=layers, vocab_size=vocab, seq_length=seq_length),
        parallel=r(cfg.parallel, tp=1, pp=1, vp=1, cp=1, sequence_parallel=False),
        batch=r(cfg.batch, minibs=2, micro_batch_size=1, eval_micro_batch_size=None),
        precision=r(pr, compute=compute, nvfp4_rht=pr.nvfp4_rht and nvfp4,
                    nvfp4_stochastic_rounding=pr.nvfp4_stochastic_rounding and nvfp4,
                    nvfp4_2d_weights=pr.nvfp4_2d_weights and nvfp4,
                    bf16_layers_at_start=0, bf16_layers_at_end=0),
        performance=r(cfg.performance, cuda_graphs="full_iteration" if graphs else "none",
                      fp8_param_gather=False, fp4_param_gather=False, tp_comm_overlap=False,
                      account_for_embedding_in_pipeline_split=False,
                      account_for_loss_in_pipeline_split=False,
                      gradient_accumulation_fusion=gaf),
        system=r(cfg.system, id=system or cfg.system.id, racks=1, gpus_per_rack=dp,
                 rack_of_host={}),
        optimizer=r(cfg.optimizer, lr=SLICE_LR, end_lr=SLICE_LR, warmup_steps=0, decay_steps=0),
        run=r(cfg.run, division="open", max_steps=steps, warmup_iters=3),
        eval=r(cfg.eval, samples=2 * dp, first_step=steps, interval_steps=steps, target=0.0),
        checkpoint=r(cfg.checkpoint, ckpt_dir=ckpt_dir, init="first-contact"),
        source=f"{cfg.source} (first-contact slice)")


class SyntheticTokens:
    """Random token ids in the datasets' format (train.batches.DTYPES), one fixed stream per
    index: the slice reads nothing from disk."""

    def __init__(self, *, vocab: int, seq_length: int, seed: int, length: int = 1 << 20) -> None:
        self.vocab, self.seq, self.seed, self.length = vocab, seq_length, seed, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        import torch
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        text = torch.randint(0, self.vocab, (self.seq + 1,), generator=g, dtype=torch.int64)
        return {"tokens": text[:-1].clone(), "labels": text[1:].clone(),
                "loss_mask": torch.ones(self.seq, dtype=torch.float32),
                "position_ids": torch.arange(self.seq, dtype=torch.int64)}


def synthetic_datasets(scfg: Config) -> tuple[SyntheticTokens, SyntheticTokens]:
    m = scfg.model
    return (SyntheticTokens(vocab=m.vocab_size, seq_length=m.seq_length, seed=1),
            SyntheticTokens(vocab=m.vocab_size, seq_length=m.seq_length, seed=2))


def weights(chunks: Iterable[torch.nn.Module]) -> dict[str, torch.Tensor]:
    """Host copies of every parameter, by name."""
    from ..model.builder import unwrap
    return {n: p.detach().to("cpu", copy=True) for c in chunks
            for n, p in unwrap(c).named_parameters()}


def loaded_weights(run: Run) -> dict[str, torch.Tensor]:
    """Host copies of `run`'s parameters as its model holds them right after the checkpoint
    load, filled by `run._init` just before the warm-up: loaded, wrapped for training (megatron's
    Float16Module casts every parameter to BF16, the FP32 weights of megatron's WrappedTorchNorm
    included) and read by the optimizer's master weights. What the warm-up restore must give
    back, bit for bit and in the same dtype, and what the training steps must move."""
    held: dict[str, torch.Tensor] = {}
    # an instance attribute over the method, on purpose: this run's init calls the capture
    run._warmup_and_restore = _before(  # type: ignore[method-assign]
        run._warmup_and_restore, lambda: held.update(weights(run.model)))
    return held


def _before(inner: Callable[_P, _R], first: Callable[[], object]) -> Callable[_P, _R]:
    """`inner` with `first()` called before each call."""
    def call(*a: _P.args, **k: _P.kwargs) -> _R:
        first()
        return inner(*a, **k)
    return call


def differing(chunks: Iterable[torch.nn.Module], ref: Mapping[str, torch.Tensor]
              ) -> list[str]:
    """Names of the parameters that differ from `ref` in shape, dtype or any bit. `ref` must be
    taken from the same wrapped model (loaded_weights): the weights as built hold
    megatron's WrappedTorchNorm weights in FP32, the wrapped model in BF16."""
    from ..model.builder import unwrap
    return [n for c in chunks for n, p in unwrap(c).named_parameters()
            if not torch_equal(p.detach().cpu(), ref[n])]


def differing_cast(held: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor]
                   ) -> list[str]:
    """Names of the parameters of `held` whose value is not `saved`'s cast to the held dtype
    (what a load of `saved` followed by megatron's Float16Module cast gives), or that are
    missing from `saved` or of another shape."""
    return [n for n, t in held.items()
            if n not in saved or not torch_equal(t, saved[n].to(t.dtype))]


def ddp_buffers(chunk: DistributedDataParallel) -> list[_ParamAndGradBuffer]:
    """The parameter-and-gradient buffers of a DDP chunk, dense then expert-parallel.
    megatron-core 0.19.2's `DistributedDataParallel.__init__` sets `buffers` to a list, over
    torch.nn.Module's `buffers()` method, which is what a type checker sees."""
    expert: list[_ParamAndGradBuffer] = getattr(chunk, "expert_parallel_buffers", [])
    return list(cast("list[_ParamAndGradBuffer]", chunk.buffers)) + list(expert)


def torch_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    import torch
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


def compare(replay: float, eager: float) -> tuple[bool, float]:
    """(bitwise equal, relative difference)."""
    if replay == eager:
        return True, 0.0
    return False, abs(replay - eager) / max(abs(eager), 1e-30)
