"""What the package reaches by a name in a string, classified (tests/test_pinned_names.py):

- ATTRIBUTES: every attribute name the package passes literally to getattr/hasattr/setattr/
  delattr. A `Pinned` place is a Transformer Engine 2.20.2 or megatron-core 0.19.2 class (its
  bases followed) or module that must define it in the pinned sources; `Elsewhere` says why
  the object is neither TE's nor megatron's. A new literal attribute fails the test until it is
  classified here, and an entry no longer used fails it too, so the table stays complete.
- DICT_KEYS: the project functions that read keys of TE's own dicts, with the TE module that
  fills the dict; each key read must be a string constant of that module.
"""
from .pinned_names import Elsewhere, Pinned

TE_BASE = "transformer_engine.pytorch.module.base"
DDP = "megatron.core.distributed.distributed_data_parallel.DistributedDataParallel"
OPT = "megatron.core.optimizer.optimizer"
GPT = "megatron.core.models.gpt.gpt_model.GPTModel"
LAYERS = "megatron.core.tensor_parallel.layers"
PROJECT_RUN = Elsewhere("the project's own run object (train.loop.Run / its state)")
TORCH_DCP = Elsewhere("torch.distributed.checkpoint's metadata (torch, not TE or megatron)")

ATTRIBUTES: dict[str, tuple[Pinned | Elsewhere, ...]] = {
    # -- Transformer Engine 2.20.2 --
    "_attention_backends": (
        Pinned("transformer_engine.pytorch.attention.dot_product_attention."
               "dot_product_attention"),),
    "fp8_meta": (Pinned(f"{TE_BASE}.TransformerEngineBaseModule"),),
    "_persistent_state_buffers": (Pinned("transformer_engine.pytorch.quantization.RecipeState"),),
    "_high_precision_init_val": (Pinned(TE_BASE),),        # set on the quantized parameters
    "get_high_precision_init_val": (Pinned(TE_BASE),),     # the same
    "dequantize": (Pinned("transformer_engine.pytorch.quantized_tensor.QuantizedTensor"),),
    "__version__": (Pinned("transformer_engine"),
                    Elsewhere("mlperf_logging's package (submission.tiny_rules)")),
    # -- megatron-core 0.19.2 --
    "module": (Pinned(DDP), Pinned("megatron.core.transformer.module.Float16Module")),
    "bucket_groups": (Pinned(DDP),),
    "ddp_config": (Pinned(DDP),),
    "expert_parallel_buffers": (Pinned(DDP),),
    "use_forward_hook": (Pinned(DDP),),
    "main_grad": (Pinned("megatron.core.distributed.param_and_grad_buffer"),),
    "grad_added_to_main_grad": (Pinned("megatron.core.distributed.distributed_data_parallel"),),
    "chained_optimizers": (Pinned(f"{OPT}.ChainedOptimizer"),),
    "optimizer": (Pinned(f"{OPT}.MegatronOptimizer"),),
    "init_state_fn": (Pinned(f"{OPT}.MegatronOptimizer"),),
    "_copy_main_params_to_model_params": (Pinned(f"{OPT}.Float16OptimizerWithFloat16Params"),),
    "shard_fp32_from_float16_groups": (
        Pinned("megatron.core.optimizer.distrib_optimizer.DistributedOptimizer"),),
    "rotary_pos_emb": (Pinned(GPT),),
    "decoder": (Pinned(GPT),),
    "compute_language_model_loss": (Pinned(GPT),),
    "cuda_graph_use_single_mempool": (
        Pinned("megatron.core.transformer.transformer_config.TransformerConfig"),),
    "_forward_impl": (Pinned(f"{LAYERS}.ColumnParallelLinear"),
                      Pinned(f"{LAYERS}.RowParallelLinear")),
    "gtp_remat_size": (Pinned(f"{LAYERS}.ColumnParallelLinear"),
                       Pinned(f"{LAYERS}.RowParallelLinear")),
    "data": (Pinned("megatron.core.dist_checkpointing.mapping.ShardedTensor"),),
    "prepend_axis_num": (Pinned("megatron.core.dist_checkpointing.mapping.ShardedTensor"),),
    "key": (Pinned("megatron.core.dist_checkpointing.mapping.ShardedObject"),),
    "datasets": (Pinned("megatron.core.datasets.blended_dataset.BlendedDataset"),),
    "dataset": (Pinned("megatron.core.datasets.megatron_dataset.MegatronDataset"),),
    "bin_buffer": (Pinned("megatron.core.datasets.indexed_dataset._IndexReader"),),
    "bin_buffer_mmap": (Pinned("megatron.core.datasets.indexed_dataset._IndexReader"),),
    # -- neither --
    "nvfp4_recipe": (Elsewhere("set by precision.emulation.emulate_linear on the linear it "
                               "wraps: the project's own marker"),),
    "_fast_forward": (Elsewhere("cpu_compat's marker on a wrapped module"),),
    "_fast_step": (Elsewhere("cpu_compat's marker on a torch optimizer"),),
    "_profile_wrapped": (Elsewhere("profile.capture's marker on a wrapped function"),),
    "_origins": (Elsewhere("config.schema.Config's own slot"),),
    "failures": (Elsewhere("the project's exceptions (failures.py)"),),
    "calibration": (Elsewhere("argparse.Namespace of cli.profile_cmd"),),
    "bufs": (Elsewhere("precision.rounding's thread-local scratch"),),
    "work": (Elsewhere("precision.rounding's thread-local scratch"),),
    "name": (Elsewhere("a Python file object (mlperf.writer's echo stream)"),),
    "run_started": (PROJECT_RUN,), "run_start_ms": (PROJECT_RUN,), "state": (PROJECT_RUN,),
    "stop_point": (PROJECT_RUN,), "te_kernels": (PROJECT_RUN,),
    "storage_data": (TORCH_DCP,), "relative_path": (TORCH_DCP,), "offset": (TORCH_DCP,),
    "length": (TORCH_DCP,), "size": (TORCH_DCP,),
    "FAKE": (Elsewhere("torch.distributed.Backend (torch's fake backend)"),),
    "ProcessGroupGloo": (Elsewhere("torch.distributed.distributed_c10d"),),
    "O_CLOEXEC": (Elsewhere("os"),),
    "posix_fadvise": (Elsewhere("os"),),
    "renameat2": (Elsewhere("the C library through ctypes.CDLL(None) (glibc >= 2.28); "
                            "outputs.rename_noreplace refuses where it is absent"),),
    "_forkserver_pid": (Elsewhere("multiprocessing.forkserver (the standard library)"),),
}

DICT_KEYS: dict[tuple[str, str], tuple[str, str]] = {
    # (project file, function) -> (TE module that fills the dict, which dict)
    ("llama31_405b/precision/te_recipe.py", "te_attention_backend"): (
        "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention",
        "_attention_backends"),
    ("llama31_405b/train/warmup.py", "_te_recipe_buffers"): (TE_BASE, "fp8_meta"),
}
