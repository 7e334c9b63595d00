"""CUDA graphs of the training loop (GPU; performance.cuda_graphs).

"full_iteration" (the GB200 default): megatron-core 0.19.2's
`megatron.core.full_cuda_graph.FullCudaGraphWrapper` wraps the pipeline schedule function (what
`get_forward_backward_func()` returns): one graph for a whole forward-backward of a training step
(gradient reduction included, the optimizer step excluded) and one for the forward-only
evaluation pass, each keyed by the wrapper's stage ("training", "validation"). How it works
(megatron-core 0.19.2, full_cuda_graph.py):

- every call first reads all `num_microbatches` microbatches from the data iterator(s) and
  copies them into static buffers (StaticBufferLoader, one set per stage and microbatch index,
  allocated from the first call's tensors): the loop's microbatches must keep their count,
  shapes and dtypes from call to call (train.batches.DTYPES; the warm-up's synthetic
  microbatches have the real ones');
- calls before `cuda_graph_warmup_steps` run eagerly; the call with that index is captured
  (torch.cuda.graph on a shared side stream, all RNG generator states of
  `get_all_rng_states()` registered with the graph, barriers around it) and replayed; later
  calls only copy their inputs and replay. The returned losses are the capture's tensors,
  refreshed by each replay;
- it is called with keyword arguments only (model, data_iterator, num_microbatches,
  seq_length, forward_only, ...), as train.step.run_schedule does.

What a capture records depends on Python state: the wrapper does not set megatron-core's
`_IS_GRAPH_CAPTURING`, so the DDP forward pre-hooks run during the capture, and at VP 1 (no
`align_param_gather`) they issue a bucket's parameter all-gather only while its
`param_gather_dispatched` is false (`_ParamAndGradBucketGroup.finish_param_sync`). A forced
gather (the warm-up restore's) or an evaluation's gathers set it true and only a training step's
`finish_grad_sync` resets it, so a training capture right after one would record no gather and
every replay would train on the other ranks' stale shards. `FullIterationGraphs.train` therefore
resets the dispatch state (`DistributedDataParallel.reset_param_sync_dispatch_state`) right
before the training capture, whatever came before it (`train.gather_dispatch.reset`).

The training graph is captured at iteration `model.builder.graph_capture_iteration(cfg)` (the
last warm-up iteration when run.warmup_iters >= 2), the evaluation graph at the second
evaluation pass; the warm-up runs two synthetic evaluation passes so both exist before
run_start. The graphs hold the addresses of parameters, gradient buffers, RNG states and
static inputs: everything the warm-up changed is restored in place (train.warmup).

"layers": Transformer Engine per-layer graphs through megatron's TECudaGraphHelper
(`capture_layer_graphs`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Unpack

from .gather_dispatch import reset as reset_gather_dispatch

if TYPE_CHECKING:   # megatron.core is imported after the TE environment check (train.loop)
    import torch
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper
    from megatron.core.optimizer import MegatronOptimizer
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.cuda_graphs import TECudaGraphHelper

    from ..config.schema import Config
    from .protocols import ForwardBackward, ScheduleArgs

EVAL_CAPTURE_PASS = 1
"""The evaluation pass (0-based) that is captured: one eager pass first."""


class _LayerGraphCapture(Protocol):
    """What `capture_layer_graphs` calls on megatron-core 0.19.2's TECudaGraphHelper, whose
    methods have no return annotation (both return nothing)."""

    def create_cudagraphs(self) -> None: ...

    def cuda_graph_set_manual_hooks(self) -> None: ...


class _GatheringCapture:
    """The training FullCudaGraphWrapper, called with the gather dispatch state reset right
    before its capture call (module docstring); every other call passes straight through."""

    def __init__(self, wrapper: FullCudaGraphWrapper) -> None:
        self.wrapper = wrapper

    def __call__(self, **kwargs: Unpack[ScheduleArgs]) -> list[dict[str, torch.Tensor]] | None:
        w = self.wrapper
        cls = type(w)
        if cls.cuda_graph["training"] is None and \
                cls.curr_iteration["training"] == w.cuda_graph_warmup_steps:
            reset_gather_dispatch(kwargs["model"])
        call: ForwardBackward = w    # megatron-core 0.19.2 types its __call__ *args, **kwargs
        return call(**kwargs)


class FullIterationGraphs:
    """The two FullCudaGraphWrapper instances of a run. The wrapper keeps its graphs, counters
    and static buffers in class attributes (one set per process); they are cleared here, so a
    process that builds several runs (tests) starts each from scratch."""

    def __init__(self, cfg: Config, tcfg: TransformerConfig) -> None:
        from megatron.core.full_cuda_graph import FullCudaGraphWrapper, StaticBufferLoader
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from ..model.builder import graph_capture_iteration
        from .evaluation import GatherAhead
        StaticBufferLoader.static_buffers = {"training": [], "validation": []}
        FullCudaGraphWrapper.cuda_graph = {"training": None, "validation": None}
        FullCudaGraphWrapper.result = {"training": None, "validation": None}
        FullCudaGraphWrapper.curr_iteration = {"training": 0, "validation": 0}
        schedule: ForwardBackward = get_forward_backward_func()   # megatron: unannotated
        single_pool: bool = getattr(tcfg, "cuda_graph_use_single_mempool", True)
        self.train = _GatheringCapture(FullCudaGraphWrapper(
            schedule, cuda_graph_warmup_steps=graph_capture_iteration(cfg),
            use_single_mempool=single_pool))
        # the evaluation pass with its parameter gathers dispatched ahead (train.evaluation):
        # captured with them, so every replay gathers the weights of its step, overlapped
        self.eval = FullCudaGraphWrapper(
            GatherAhead(schedule), cuda_graph_warmup_steps=EVAL_CAPTURE_PASS,
            use_single_mempool=single_pool)

    @staticmethod
    def captured() -> dict[str, bool]:
        from megatron.core.full_cuda_graph import FullCudaGraphWrapper
        return {k: g is not None for k, g in FullCudaGraphWrapper.cuda_graph.items()}


def capture_layer_graphs(cfg: Config, model: list[DistributedDataParallel],
                         optimizer: MegatronOptimizer, tcfg: TransformerConfig, *,
                         rank: int) -> TECudaGraphHelper:
    """Per-layer CUDA graphs (Transformer Engine make_graphed_callables), captured once
    before run_start, after the warm-up iterations, as Megatron's own training loop does
    (megatron/training/training.py, train(): capture at iteration == cuda_graph_warmup_steps).

    TECudaGraphHelper reads the number of microbatches per step from Megatron's global
    microbatch calculator (megatron.core.transformer.cuda_graphs _get_cuda_graph_input_data
    and its num_warmup_iters formula), which this project's schedule does not otherwise use: it
    is configured here from cfg (GBS, MBS, DP), so one graph per layer and microbatch of the
    interleaved schedule is captured. The DDP parameter-gather pre-hooks are off during
    capture (without the forced synchronous gather: Megatron passes param_sync=False) and the
    graphed layers get manual hooks."""
    from megatron.core.transformer.cuda_graphs import TECudaGraphHelper

    from .step import configure_num_microbatches
    configure_num_microbatches(cfg, rank=rank)
    helper = TECudaGraphHelper(model=model, config=tcfg, seq_length=cfg.model.seq_length,
                               micro_batch_size=cfg.batch.micro_batch_size,
                               optimizers=[optimizer])
    capture: _LayerGraphCapture = helper
    overlap_gather = cfg.performance.overlap_param_gather and cfg.optimizer.distributed
    if overlap_gather:
        for m in model:
            m.disable_forward_pre_hook(param_sync=False)
    capture.create_cudagraphs()
    if overlap_gather:
        for m in model:
            m.enable_forward_pre_hook()
        capture.cuda_graph_set_manual_hooks()
    return helper
