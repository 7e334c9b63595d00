"""Config -> Megatron-core Llama 3.1: TransformerConfig, layer spec, model chunks, DDP and
optimizer configs. This module is the one place where the config's model, parallel, precision
and performance sections become Megatron settings.

Llama 3.1 in Megatron terms: RMSNorm (eps 1e-5), SwiGLU MLP (gated linear unit with SiLU), GQA,
no biases, untied input embedding and output layer, RoPE with base 500000 and the Llama 3.1
frequency scaling (computed here from cfg.model, see `rope.py`), no dropout.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

import torch
import torch.nn.functional as F

from ..config.schema import Config
from ..systems.device import Device, decide
from .rope import llama31_inv_freq

if TYPE_CHECKING:
    # megatron-core is imported inside the functions at run time (after the process set-up that
    # must precede it); its classes are the annotations' types
    from megatron.core.distributed import (DistributedDataParallel,
                                           DistributedDataParallelConfig)
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.gpt import GPTModel
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.param_layout import FullParamLayout
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _device(cfg: Config, device: Device | None) -> Device:
    """The caller's device decision, or the one decision for cfg in this process."""
    return device if device is not None else decide(cfg)


def _has_module(name: str) -> bool:
    """Whether an optional (compiled) module is importable, without importing it."""
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class GpuSetupError(RuntimeError):
    """A GPU setting of the config needs a module this image does not provide."""


def _te_path(cfg: Config, device: Device) -> bool:
    """Transformer Engine layers: on GPU when TE is installed. GPU settings that only exist
    with TE (fp8/nvfp4 compute, per-layer CUDA graphs, TP comm overlap, CP attention,
    sequence-parallel norms) are an error without it, before anything is built; a plain BF16
    GPU run without TE (e.g. bench/gpu_layer.py on a bare GPU machine) uses Megatron's local
    layers."""
    if not device.gpu:
        return False
    if _has_module("transformer_engine"):
        return True
    pr, perf = cfg.precision, cfg.performance
    need = [k for k, on in (("precision.compute = " + pr.compute, pr.compute in ("fp8", "nvfp4")),
                            ("performance.cuda_graphs = \"layers\"", perf.cuda_graphs == "layers"),
                            ("performance.tp_comm_overlap", perf.tp_comm_overlap),
                            ("parallel.cp > 1", cfg.parallel.cp > 1),
                            ("parallel.sequence_parallel", cfg.parallel.sequence_parallel)) if on]
    if need:
        raise GpuSetupError(f"{cfg.source or '<config>'}: {', '.join(need)} need(s) Transformer "
                            "Engine on GPU, which is not installed (pip install '.[gpu]' or use "
                            "the project's container)")
    return False


GRAD_ACCUM_FUSION_MODULE = "fused_weight_gradient_mlp_cuda"


def gradient_accumulation_fusion(cfg: Config, device: Device) -> bool:
    """performance.gradient_accumulation_fusion on GPU (the CPU has no fused kernels).

    Transformer Engine's linears fuse the weight-gradient accumulation into main_grad
    themselves, but Megatron's own ColumnParallelLinear (the output layer) needs Apex's
    `fused_weight_gradient_mlp_cuda`: megatron-core 0.19.2 tensor_parallel.layers
    ColumnParallelLinear.__init__ raises a RuntimeError without it, after process groups and
    part of the model exist (RowParallelLinear would only fail in its first backward). Refused
    here, naming the config key, before anything is built."""
    on = device.gpu and cfg.performance.gradient_accumulation_fusion
    if on and not _has_module(GRAD_ACCUM_FUSION_MODULE):
        raise GpuSetupError(
            f"{cfg.source or '<config>'}: performance.gradient_accumulation_fusion = true needs "
            f"Apex's {GRAD_ACCUM_FUSION_MODULE} extension, which this Python cannot import (build "
            "the project's Dockerfile, which compiles Apex with --cpp_ext --cuda_ext), or set "
            "performance.gradient_accumulation_fusion = false")
    return on


def _recompute_kwargs(mode: str) -> dict[str, str | int | list[str]]:
    if mode == "selective":   # recompute the attention core (softmax(QK^T)V): cheap, big savings
        return {"recompute_granularity": "selective", "recompute_modules": ["core_attn"]}
    if mode == "full":        # recompute every transformer layer from its input
        return {"recompute_granularity": "full", "recompute_method": "uniform",
                "recompute_num_layers": 1}
    return {}


_CUDA_GRAPH_IMPL = {"none": "none", "layers": "transformer_engine",
                    "full_iteration": "full_iteration"}


def graph_capture_iteration(cfg: Config) -> int:
    """Full-iteration CUDA graphs: the training iteration (0-based) that is captured; the ones
    before it run eagerly. All warm-up iterations but the last (at least one: NCCL
    communicators, cuBLAS/cuDNN handles and compiled fusions are created lazily and cannot be
    created inside a capture), so with run.warmup_iters >= 2 the graph exists before run_start."""
    return max(1, cfg.run.warmup_iters - 1)


def transformer_config(cfg: Config, *, device: Device | None = None) -> TransformerConfig:
    """The Megatron TransformerConfig of `cfg` (model shape, layout, precision, performance) on
    `device` (default: decide(cfg))."""
    from megatron.core.transformer import TransformerConfig

    m, p, pr, perf = cfg.model, cfg.parallel, cfg.precision, cfg.performance
    device = _device(cfg, device)
    gpu = device.gpu
    te = _te_path(cfg, device)
    params_dtype = _DTYPE[pr.params]
    # Any: TransformerConfig's fields have many types; its keywords are checked by
    # tests/test_megatron_keywords.py, not by mypy (a ** call is not checked key by key)
    kw: dict[str, Any] = dict(
        # --- model shape: Llama 3.1 ---
        num_layers=m.num_layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups,
        kv_channels=m.kv_channels, normalization="RMSNorm", layernorm_epsilon=m.norm_epsilon,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        add_qkv_bias=False, hidden_dropout=0.0, attention_dropout=0.0,
        init_method_std=m.init_method_std,
        # --- layout ---
        tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp,
        virtual_pipeline_model_parallel_size=p.vp if p.vp > 1 else None,
        context_parallel_size=p.cp, sequence_parallel=p.sequence_parallel,
        account_for_embedding_in_pipeline_split=perf.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=perf.account_for_loss_in_pipeline_split,
        # interleaved 1F1B on GPU: overlap the pipeline sends/receives with compute. On gloo,
        # batched p2p mismatches messages when both pipeline neighbours are the same rank (PP2
        # interleaved sends activations and gradients to one peer in one batch): use Megatron's
        # ordered individual sends/receives there.
        overlap_p2p_comm=gpu and p.vp > 1, batch_p2p_comm=gpu and p.vp == 1,
        deallocate_pipeline_outputs=gpu,
        # --- numerics ---
        params_dtype=params_dtype, pipeline_dtype=params_dtype, bf16=pr.params == "bf16",
        # loss = sum over tokens / tokens of the whole global batch, whatever the layout
        calculate_per_token_loss=True,
        # --- performance ---
        tp_comm_overlap=perf.tp_comm_overlap,
        cuda_graph_impl=_CUDA_GRAPH_IMPL[perf.cuda_graphs],
        **_recompute_kwargs(perf.recompute),
        # fused kernels need CUDA; CPU runs the plain PyTorch ops. RoPE fusion is TE's kernel
        # (TransformerConfig rejects it without TE). Gradient-accumulation fusion is the
        # config's choice, checked against the image (gradient_accumulation_fusion above). The
        # masked-softmax kernels (scaled_masked_softmax_cuda, Apex) only serve the local
        # attention. persist_layer_norm only with TE, as Megatron-LM's default (megatron-core
        # 0.19.2 megatron.training.argument_utils.core_transformer_config_from_args: on unless
        # --no-persist-layer-norm); TE's norms (TENorm, TELayerNormColumnParallelLinear) do not
        # read it, it selects Apex's persistent kernel in megatron's FusedLayerNorm (LayerNorm
        # only), and the local spec's RMSNorm, megatron's WrappedTorchNorm, asserts it is off
        # (WrappedTorchNorm.__new__): tests/test_gpu_model_build.py builds that spec.
        bias_activation_fusion=gpu, persist_layer_norm=te, bias_dropout_fusion=gpu,
        masked_softmax_fusion=gpu and _has_module("scaled_masked_softmax_cuda"),
        apply_rope_fusion=te,
        gradient_accumulation_fusion=gradient_accumulation_fusion(cfg, device),
        cross_entropy_loss_fusion=gpu,
        use_cpu_initialization=not gpu,
    )
    if perf.cuda_graphs == "layers":
        kw["cuda_graph_modules"] = []   # capture whole transformer layers
        # the uncaptured iterations before capture (train.loop: warm-up, then capture); Megatron
        # derives TE's per-graph warm-up count from it (cuda_graphs.py num_warmup_iters)
        kw["cuda_graph_warmup_steps"] = cfg.run.warmup_iters
    elif perf.cuda_graphs == "full_iteration":
        # one graph for each whole forward-backward (training) and forward (evaluation),
        # captured by megatron.core.full_cuda_graph.FullCudaGraphWrapper around the schedule
        # (train.graphs); TransformerConfig.__post_init__ (0.19.2) requires empty
        # cuda_graph_modules with this implementation
        kw["cuda_graph_modules"] = []
        kw["cuda_graph_warmup_steps"] = graph_capture_iteration(cfg)
    if gpu and perf.cuda_graphs != "none":
        # TE's graph-safe RNG tracker (parallel.setup.seed_model_parallel(cuda_graphs=True)),
        # as Megatron's arguments set --te-rng-tracker for CUDA graphs
        kw["use_te_rng_tracker"] = True
    if gpu:
        kw["fp8_param"] = perf.fp8_param_gather
        kw["fp4_param"] = perf.fp4_param_gather
        if pr.compute in ("fp8", "nvfp4"):
            # FP8/NVFP4 recipe fields (fp4, fp4_recipe, BF16 edge layers, ...) come from the
            # precision package, which also owns the TE environment knobs.
            from ..precision.te_recipe import transformer_config_kwargs
            kw.update(transformer_config_kwargs(cfg))
    return TransformerConfig(**kw)


def layer_spec(cfg: Config, *, te: bool | None = None,
               device: Device | None = None) -> ModuleSpec:
    """Transformer Engine layer spec on GPU (with TE installed), Megatron's local (pure PyTorch)
    spec otherwise; `te=False` asks for the local spec on GPU too (bench/gpu_layer.py)."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec, get_gpt_layer_with_transformer_engine_spec)
    if _te_path(cfg, _device(cfg, device)) if te is None else te:
        return get_gpt_layer_with_transformer_engine_spec()
    return get_gpt_layer_local_spec(normalization="RMSNorm")


def _cpu_block_spec(layer: ModuleSpec, tcfg: TransformerConfig,
                    vp_stage: int | None) -> TransformerBlockSubmodules:
    """The local layer spec as a whole block whose final norm is PyTorch's RMSNorm. Given a
    layer spec, megatron-core 0.19.2 (transformer_block._get_block_submodules) takes the final
    norm from its module-level LayerNormImpl, which is Transformer Engine's TENorm wherever TE
    is importable: a CPU model on a GPU image would get a TE norm it cannot run."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import (TransformerBlockSubmodules,
                                                             get_num_layers_to_build)
    n = get_num_layers_to_build(tcfg, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[layer] * n, layer_norm=WrappedTorchNorm)


def ddp_config(cfg: Config) -> DistributedDataParallelConfig:
    """Megatron DDP: FP32 gradient buckets, overlapped reduce-scatter/all-gather, distributed
    optimizer, FP8/FP4 parameter all-gather."""
    from megatron.core.distributed import DistributedDataParallelConfig
    perf = cfg.performance
    # Any: as transformer_config's keywords (tests/test_megatron_keywords.py checks them)
    kw: dict[str, Any] = dict(
        grad_reduce_in_fp32=cfg.precision.grad_reduce_in_fp32,
        overlap_grad_reduce=perf.overlap_grad_reduce,
        overlap_param_gather=perf.overlap_param_gather,
        align_param_gather=_align_param_gather(cfg),
        use_distributed_optimizer=cfg.optimizer.distributed,
        fp8_param_gather=perf.fp8_param_gather, fp4_param_gather=perf.fp4_param_gather,
        # per-token loss: gradients are summed and divided by the global token count
        average_in_collective=False, check_for_nan_in_grad=False)
    if perf.ddp_bucket_size is not None:
        kw["bucket_size"] = perf.ddp_bucket_size
    return DistributedDataParallelConfig(**kw)


def _align_param_gather(cfg: Config) -> bool:
    """Megatron's rule (megatron/training/arguments.py, training.py): with the interleaved
    schedule the pipeline schedule dispatches each chunk's parameter all-gather
    (config.param_sync_func) and the DDP pre-hooks only wait (align_param_gather); without
    it the pre-hooks chain the gathers themselves and no param_sync_func is set."""
    return (cfg.performance.overlap_param_gather and cfg.optimizer.distributed
            and cfg.parallel.vp > 1)


def optimizer_config(cfg: Config) -> OptimizerConfig:
    """AdamW with the rule-derived hyperparameters (cfg.derived), gradient clipping, FP32 master
    weights; the LR itself is set every step by train.schedule."""
    from megatron.core.optimizer import OptimizerConfig
    d = cfg.derived
    return OptimizerConfig(
        optimizer="adam", decoupled_weight_decay=True, lr=d.lr, min_lr=d.end_lr,
        weight_decay=d.weight_decay, adam_beta1=d.adam_beta1, adam_beta2=d.adam_beta2,
        adam_eps=d.adam_eps, clip_grad=d.clip_grad, bf16=cfg.precision.params == "bf16",
        params_dtype=_DTYPE[cfg.precision.params],
        use_distributed_optimizer=cfg.optimizer.distributed,
        overlap_param_gather=cfg.performance.overlap_param_gather)


def build_model(cfg: Config, *, config: TransformerConfig | None = None,
                device: Device | None = None) -> list[GPTModel]:
    """The model chunks of this rank (one per virtual pipeline stage), not yet wrapped in DDP.

    Needs megatron's parallel_state initialised (llama31_405b.parallel.setup). The vocabulary is
    padded to cfg.derived.padded_vocab_size; RoPE uses the exact Llama 3.1 scaling of cfg.model.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    device = _device(cfg, device)
    tcfg = config if config is not None else transformer_config(cfg, device=device)
    spec = layer_spec(cfg, device=device)
    vp = cfg.parallel.vp
    inv_freq = llama31_inv_freq(cfg.model)
    chunks: list[GPTModel] = []
    for stage in range(vp):
        vp_stage = stage if vp > 1 else None
        model = GPTModel(
            config=tcfg,
            # megatron-core 0.19.2 annotates GPTModel's transformer_layer_spec ModuleSpec, but
            # passes it to TransformerBlock, whose spec is Union[TransformerBlockSubmodules,
            # ModuleSpec]: the CPU's whole-block spec (_cpu_block_spec) is one of those
            transformer_layer_spec=(spec if device.gpu  # type: ignore[arg-type]
                                    else _cpu_block_spec(spec, tcfg, vp_stage)),
            vocab_size=cfg.derived.padded_vocab_size, max_sequence_length=cfg.model.seq_length,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            parallel_output=True, share_embeddings_and_output_weights=False,
            # megatron-core 0.19.2 annotates GPTModel's rotary_base int; the config's float works
            # (RotaryEmbedding.__init__ raises it to a tensor power) and inv_freq is set below
            position_embedding_type="rope", rotary_percent=1.0,
            rotary_base=cfg.model.rope_base,  # type: ignore[arg-type]
            # Megatron's built-in Llama 3 scaling hardcodes low=1, high=4, original=8192; the
            # project sets the frequencies from cfg.model below instead.
            rope_scaling=False, vp_stage=vp_stage)
        rope: RotaryEmbedding | None = getattr(model, "rotary_pos_emb", None)
        if rope is not None:
            rope.inv_freq = inv_freq.to(rope.inv_freq.device)
            model.rotary_pos_emb_cache.clear()
        chunks.append(model)
    if cfg.precision.compute == "nvfp4" and not device.gpu:
        from ..precision.emulation import apply_nvfp4_emulation
        apply_nvfp4_emulation(chunks, cfg)
    return chunks


def _full_param_layouts(dcfg: DistributedDataParallelConfig,
                        modules: Sequence[torch.nn.Module]) -> list[FullParamLayout | None]:
    """The distributed optimizer's parameter layout of each chunk, computed before DDP as
    megatron-core 0.19.2 asks (`DistributedDataParallel.__init__` logs "full_param_layout not
    provided ... Auto-computing layout inside DDP" otherwise), with what DDP would use itself:
    `DistributedOptimizer.compute_full_param_layout` over the chunk's trainable parameters, the
    bucket size DDP resolves (its default for an unset size, none without overlapped reduction,
    none for a chunk built with `disable_bucketing` or on a pipeline rank > 0), and the sizes of
    the intra-instance data-parallel groups (with CP) DDP shards over; as Megatron-LM's
    `wrap_model_chunks_with_ddp` (megatron/training/training.py). DDP checks that the layout
    matches its own grouping of the parameters. Resolves `dcfg.bucket_size` in place, as DDP's
    __init__ would. Empty without the distributed optimizer (DDP computes none then)."""
    from megatron.core import parallel_state as ps
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    if not dcfg.use_distributed_optimizer:
        return [None] * len(modules)
    # the groups DDP takes (megatron-core 0.19.2 ProcessGroupCollection.setup_process_groups_for_ddp)
    dp = ps.get_data_parallel_group(with_context_parallel=False, with_gtp_remat=False,
                                    partial_data_parallel=False)
    if dcfg.bucket_size is None:
        dcfg.bucket_size = max(40000000, 1000000 * dp.size())
    if not dcfg.overlap_grad_reduce:
        dcfg.bucket_size = None
    dp_cp = ps.get_data_parallel_group(with_context_parallel=True, with_gtp_remat=False,
                                       partial_data_parallel=True)
    expt = ps.get_expert_data_parallel_group(with_gtp_remat=False,
                                             partial_expert_data_parallel=True)
    pp_rank = ps.get_pipeline_model_parallel_rank()
    return [DistributedOptimizer.compute_full_param_layout(
        [p for p in m.parameters() if p.requires_grad],
        None if (i > 0 or pp_rank > 0) else dcfg.bucket_size, dp_cp.size(), dcfg,
        expert_data_parallel_world_size=expt.size()) for i, m in enumerate(modules)]


def _ddp_stream(
        tcfg: TransformerConfig,
) -> tuple[contextlib.AbstractContextManager[object], torch.cuda.Stream | None]:
    """Where DDP is built on GPU: megatron-core 0.19.2's shared full-iteration capture stream
    with full-iteration graphs (so the AccumulateGrad nodes DDP keeps do not reference another,
    non-capturing stream), a fresh stream otherwise, as Megatron-LM's `get_model`
    (megatron/training/training.py); on CPU no stream."""
    if not torch.cuda.is_available() or tcfg.use_cpu_initialization:
        return contextlib.nullcontext(), None
    if tcfg.cuda_graph_impl == "full_iteration":
        from megatron.core.full_cuda_graph import get_shared_capture_stream
        # megatron-core 0.19.2 leaves get_shared_capture_stream unannotated: a torch.cuda.Stream
        stream = cast(torch.cuda.Stream, get_shared_capture_stream())
    else:
        stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    return torch.cuda.stream(stream), stream


def wrap_for_training(cfg: Config, chunks: Sequence[GPTModel]) -> list[DistributedDataParallel]:
    """Megatron DDP around each chunk (after Float16Module for BF16 parameters), with the
    distributed optimizer's parameter layouts computed first (`_full_param_layouts`), and the
    gradient finalisation hook: without config.finalize_model_grads_func the data-parallel
    gradients are never reduced and replicas silently diverge."""
    from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
    from megatron.core.transformer.module import Float16Module
    tcfg = chunks[0].config
    dcfg = ddp_config(cfg)
    inner: list[MegatronModule] = [Float16Module(tcfg, chunk) if tcfg.bf16 else chunk for chunk in chunks]
    layouts = _full_param_layouts(dcfg, inner)
    where, stream = _ddp_stream(tcfg)
    with where:
        # only the first chunk's buckets start the reduction early (Megatron convention); the
        # layouts assume the same (`disable_bucketing=(i > 0)`)
        wrapped = [DistributedDataParallel(config=tcfg, ddp_config=dcfg, module=m,
                                           disable_bucketing=(i > 0), full_param_layout=lay)
                   for i, (m, lay) in enumerate(zip(inner, layouts))]
    if stream is not None:
        torch.cuda.current_stream().wait_stream(stream)
    tcfg.finalize_model_grads_func = finalize_model_grads
    # as Megatron's training loop: hooks only when gradient reduction overlaps the backward pass
    # megatron-core 0.19.2 annotates these three fields Optional[Callable], but its interleaved
    # schedule (pipeline_parallel.schedules.forward_backward_pipelining_with_interleaving) takes
    # a list of them, one per chunk, as Megatron-LM's training loop sets them: the ignores below
    if cfg.performance.overlap_grad_reduce:
        tcfg.no_sync_func = _one_or_all([w.no_sync for w in wrapped])  # type: ignore[assignment]
        tcfg.grad_sync_func = _one_or_all(  # type: ignore[assignment]
            [w.start_grad_sync for w in wrapped])
    if _align_param_gather(cfg):
        tcfg.param_sync_func = _one_or_all(  # type: ignore[assignment]
            [w.start_param_sync for w in wrapped])
    return wrapped


def _one_or_all(fns: list[Callable[..., Any]]) -> Callable[..., Any] | list[Callable[..., Any]]:
    """A hook of one chunk alone, the list of them with several (Megatron's convention)."""
    return fns[0] if len(fns) == 1 else fns


def unwrap(chunk: torch.nn.Module) -> GPTModel:
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(chunk, "module"):
        # torch types a submodule attribute Tensor | Module; `module` is always the wrapped module
        chunk = cast(torch.nn.Module, chunk.module)
    # the chunks are build_model's: a GPTModel once the wrappers are off
    return cast("GPTModel", chunk)
