"""The precision, GPU-setting and CUDA-graph rules of `config.validate`: every Transformer Engine
(TE 2.20.2) and megatron-core 0.19.2 constraint the project knows of, stated once, here. The
precision package (`precision.te_recipe`) builds the recipe and calls these rules rather than
repeating them. Each rule function returns its messages (empty when the config satisfies it).
"""
from __future__ import annotations

from .derived import Derived
from .env import launch_env
from .schema import Config

NVFP4_FP8_ATTENTION_RECIPES = ("DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling")
"""NVTE_DPA_FP8_RECIPE values with which TE 2.20.2 runs FP8 attention under an NVFP4 autocast
(`DotProductAttention.forward` builds an FP8 recipe for the attention from them; with the variable
unset the attention gets the NVFP4 recipe itself, for which TE's backend selection,
`attention.dot_product_attention.utils.get_attention_backend`, disables fused FP8 attention)."""


def precision_rules(cfg: Config, d: Derived) -> list[str]:
    """Compute precision the system runs; the NVFP4 knobs and BF16 edge layers where they apply."""
    out, pr, m, system = [], cfg.precision, cfg.model, d.system
    if pr.compute == "nvfp4" and system.nvfp4 == "none":
        out.append(f"precision.compute = nvfp4 needs a Blackwell GPU: {system.name} has no NVFP4 "
                   "(use fp8 or bf16)")
    if pr.compute == "fp8" and system.peak_tflops_fp8 == 0 and system.nvfp4 != "emulated":
        out.append(f"precision.compute = fp8 is not supported on {system.name}")
    if pr.compute in ("fp32", "bf16") and (pr.bf16_layers_at_start or pr.bf16_layers_at_end):
        out.append("precision.bf16_layers_at_start/end only apply to fp8 or nvfp4 compute")
    if pr.bf16_layers_at_start + pr.bf16_layers_at_end > m.num_layers:
        out.append("precision: more BF16 edge layers than model layers")
    if pr.compute != "nvfp4" and (pr.nvfp4_rht or pr.nvfp4_stochastic_rounding or pr.nvfp4_2d_weights):
        out.append("precision.nvfp4_* knobs need precision.compute = nvfp4")
    if pr.nvfp4_tp_amax != "te" and (pr.compute != "nvfp4" or system.nvfp4 != "emulated"):
        out.append("precision.nvfp4_tp_amax = \"tensor\" is an NVFP4-emulation option (compute = "
                   f"nvfp4 on an emulated system); {system.name} needs \"te\"")
    return out + attention_rules(cfg, d) + param_gather_rules(cfg, d)


def attention_rules(cfg: Config, d: Derived) -> list[str]:
    """FP8 attention runs under an FP8 or NVFP4 autocast only, and TE has no NVFP4 attention."""
    pr = cfg.precision
    if pr.attention != "fp8":
        return []
    if pr.compute not in ("fp8", "nvfp4"):
        return ["precision.attention = fp8 needs precision.compute = fp8 or nvfp4"]
    if pr.compute == "nvfp4" and d.system.nvfp4 == "native":
        dpa = launch_env(cfg).get("NVTE_DPA_FP8_RECIPE")
        if dpa not in NVFP4_FP8_ATTENTION_RECIPES:
            return [f"precision.attention = fp8 with compute = nvfp4 needs NVTE_DPA_FP8_RECIPE in "
                    f"{NVFP4_FP8_ATTENTION_RECIPES} (found {dpa!r}): Transformer Engine has no "
                    "NVFP4 attention; set it in the config's [env] table, or keep "
                    "precision.attention = bf16"]
    return []


def param_gather_rules(cfg: Config, d: Derived) -> list[str]:
    """Quantized parameter all-gather (Megatron fp8_param / fp4_param)."""
    out, pr, perf = [], cfg.precision, cfg.performance
    if perf.fp4_param_gather and pr.compute != "nvfp4":
        out.append("performance.fp4_param_gather needs precision.compute = nvfp4")
    if perf.fp4_param_gather and pr.compute == "nvfp4" and not pr.nvfp4_2d_weights:
        # megatron-core 0.19.2 DistributedOptimizer._copy_main_params_to_model_params ->
        # fp4_utils.quantize_nvfp4_param_shard -> TE 2.20.2 tensor.utils.quantize_master_weights,
        # whose NVFP4 branch (_cast_master_weights_to_nvfp4_2d) raises for 1D weight quantizers
        out.append("performance.fp4_param_gather needs precision.nvfp4_2d_weights = true: after "
                   "each optimizer step Transformer Engine casts the FP32 master weights into NVFP4 "
                   "parameters only with 2D weight blocks (TE 2.20.2 quantize_master_weights raises "
                   "\"NVFP4 2D quantization must be enabled.\"). Gather parameters in BF16 "
                   "(fp4_param_gather = false), as the MLPerf GB200 runs do, or enable 2D weights")
    if perf.fp8_param_gather and pr.compute != "fp8":
        out.append("performance.fp8_param_gather needs precision.compute = fp8 (Megatron's "
                   "fp8_param); with nvfp4 compute use performance.fp4_param_gather")
    if perf.fp8_param_gather and perf.fp4_param_gather:
        out.append("performance: choose one of fp8_param_gather and fp4_param_gather")
    if (perf.fp8_param_gather or perf.fp4_param_gather) and not cfg.optimizer.distributed:
        out.append("performance.fp8/fp4_param_gather needs optimizer.distributed = true (only "
                   "Megatron's distributed optimizer writes its FP32 master shards back into "
                   "quantized parameters)")
    return out


def gpu_setting_rules(cfg: Config, d: Derived) -> list[str]:
    """GPU-only settings stay off on CPU; the DDP overlap and housekeeping settings are
    consistent."""
    out, p, pr, perf = [], cfg.parallel, cfg.precision, cfg.performance
    if not d.system.is_gpu:
        gpu_only = [k for k, on in (("performance.cuda_graphs", perf.cuda_graphs != "none"),
                                    ("performance.tp_comm_overlap", perf.tp_comm_overlap),
                                    ("performance.fp8_param_gather", perf.fp8_param_gather),
                                    ("performance.fp4_param_gather", perf.fp4_param_gather),
                                    ("performance.gradient_accumulation_fusion",
                                     perf.gradient_accumulation_fusion)) if on]
        if gpu_only:
            out.append(f"{', '.join(gpu_only)}: GPU-only settings on system {cfg.system.id!r}")
        if p.cp > 1:
            out.append("parallel.cp > 1 needs Transformer Engine attention (GPU); use cp = 1 on CPU")
        if p.sequence_parallel:
            out.append("parallel.sequence_parallel needs Transformer Engine norms (GPU); disable "
                       "it on CPU")
        if pr.compute == "fp8":
            out.append("precision.compute = fp8 needs Transformer Engine (GPU); use fp32, bf16 or "
                       "nvfp4 on CPU")
    elif p.tp > 1 and not p.sequence_parallel:
        out.append("parallel.sequence_parallel should be on with TP > 1 on GPU (activation memory)")
    out += userbuffer_rules(cfg, d)
    if perf.overlap_param_gather and not cfg.optimizer.distributed:
        out.append("performance.overlap_param_gather needs optimizer.distributed = true")
    if perf.overlap_param_gather and not perf.overlap_grad_reduce:
        out.append("performance.overlap_param_gather needs performance.overlap_grad_reduce = true "
                   "(Megatron's rule: the parameter gather is overlapped through the gradient "
                   "buckets)")
    if perf.manual_gc and perf.manual_gc_interval < 1:
        out.append("performance.manual_gc_interval must be >= 1")
    if perf.ddp_bucket_size is not None and perf.ddp_bucket_size < 1:
        out.append("performance.ddp_bucket_size must be >= 1 element (or unset: Megatron's default)")
    return out


def userbuffer_rules(cfg: Config, d: Derived) -> list[str]:
    """TP communication overlap through TE userbuffers: TE 2.20.2
    transformer_engine.pytorch.module.base.fill_userbuffers_buffer_for_all_gather takes
    unquantized, Float8 and MXFP8 tensors only ("Unsupported quantizer for Userbuffers")."""
    if cfg.performance.tp_comm_overlap and cfg.precision.compute == "nvfp4":
        return ["performance.tp_comm_overlap with precision.compute = nvfp4: Transformer Engine "
                "userbuffers cannot all-gather NVFP4 tensors; set tp_comm_overlap = false (as the "
                "MLPerf GB200 NVFP4 runs do)"]
    return []


def cuda_graph_rules(cfg: Config, d: Derived) -> list[str]:
    """What megatron-core 0.19.2 requires of CUDA-graph capture (docs/training.md, "the rules
    behind its GPU settings").
    Full-iteration graphs (`cuda_graph_impl="full_iteration"`, the schedule wrapped in
    `megatron.core.full_cuda_graph.FullCudaGraphWrapper`) capture the whole forward-backward pass
    of every microbatch, so nothing in it may synchronise with the host."""
    out: list[str] = []
    p, perf = cfg.parallel, cfg.performance
    if perf.cuda_graphs == "none":
        return out
    if perf.cuda_graphs == "layers" and perf.recompute == "full":
        # TransformerConfig.__post_init__: "full recompute is only supported with full iteration
        # CUDA graph."
        out.append("performance.recompute = \"full\" with cuda_graphs = \"layers\": megatron-core "
                   "supports full recomputation only with full-iteration graphs; use cuda_graphs = "
                   "\"full_iteration\" or recompute = \"selective\"/\"none\"")
    if perf.cuda_graphs == "full_iteration" and p.pp > 1 and p.vp == 1:
        # the builder's non-interleaved pipeline uses batched P2P (batch_p2p_comm), after which
        # P2PCommunicator._communicate calls torch.cuda.synchronize() (batch_p2p_sync)
        out.append("performance.cuda_graphs = \"full_iteration\" with PP > 1 and VP = 1: the "
                   "non-interleaved schedule's batched pipeline sends synchronise the device "
                   "(megatron-core P2PCommunicator._communicate, batch_p2p_sync), which a graph "
                   "capture forbids; use parallel.vp > 1 or cuda_graphs = \"layers\"")
    if perf.cuda_graphs == "full_iteration" and cfg.run.warmup_iters < 2:
        # model.builder.graph_capture_iteration: the captured training iteration follows at least
        # one eager one (NCCL communicators, cuBLAS handles and compiled fusions are created
        # lazily and cannot be created inside a capture); with fewer than 2 warm-up iterations
        # the capture would fall inside the timed run. (Whether the captured step gathers the
        # parameters does not depend on this rule: train.graphs resets the DDP gather dispatch
        # state before the capture.)
        out.append(f"performance.cuda_graphs = \"full_iteration\" needs run.warmup_iters >= 2 "
                   f"(found {cfg.run.warmup_iters}): one eager iteration, then the capture, both "
                   "before run_start; set run.warmup_iters = 2")
    env = launch_env(cfg)
    expandable = "expandable_segments:True" in env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",")
    if expandable and env.get("NCCL_GRAPH_REGISTER") != "0":
        # megatron.training.arguments.validate_args, for per-layer graphs; a full-iteration graph
        # captures the same NCCL collectives
        out.append("CUDA graphs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True need "
                   "NCCL_GRAPH_REGISTER=0 (megatron-core: illegal memory access otherwise); set it "
                   "in the launch environment or the config's [env] table")
    return out
