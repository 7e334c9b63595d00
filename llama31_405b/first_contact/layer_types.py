"""The types of the layer phase's figures (module layer): what each measurement returns and
the report keeps, and the stand-ins its checks accept."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypedDict

if TYPE_CHECKING:
    from .gemm import GemmRow


class PlannerLayer(TypedDict):
    fwd_s: float
    bwd_s: float
    attention_s: float


class LayerTiming(TypedDict):
    """One layer's forward and backward medians (bench_layer)."""
    shape: str
    seq: int
    heads: int
    query_groups: int
    ffn: int
    fwd_s: float
    bwd_s: float
    flops: float
    flops_by_part: dict[str, float]
    peak_gib: float


class LayerRow(LayerTiming):
    """A layer_bf16 row: the timing beside the ceiling, the datasheet and the planner."""
    total_s: float
    model_tflops: float
    mfu_vs_measured_ceiling: float
    mfu_vs_datasheet: float
    planner_fwd_s: float
    planner_bwd_s: float
    planner_attention_s: float
    planner_over_measured: float


class Nvfp4Figures(TypedDict):
    """The nvfp4_emulation check's figures."""
    quantized_operands_bitwise: bool
    linear_cpu_vs_gpu_rel: float
    shape_tokens_in_out: list[int]
    rel_error_vs_fp32: float
    fwd_bwd_s: dict[str, float]
    slowdown_vs_bf16: float


class Note(Protocol):
    """Where nvfp4_emulation sends each figure as it is measured."""
    def __call__(self, **figures: object) -> None: ...


class ShardGemms(Protocol):
    """gemm.shard_gemms, or a stand-in for it (gemms_check)."""
    def __call__(self, shapes: Mapping[str, Sequence[int]], *, precisions: Sequence[str],
                 on_row: Callable[[str, str, GemmRow], None]) -> dict[str, dict[str, GemmRow]]:
        ...
