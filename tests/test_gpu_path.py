"""The GPU-only code paths, checked on CPU against the installed megatron-core 0.19.2: the
TransformerConfig the GB200 configs produce on a GPU with Transformer Engine, the TE userbuffer
modes, the FP8/FP4-parameter checkpoint load, the microbatch calculator the CUDA-graph capture
reads, and the megatron APIs the training loop calls there."""
import dataclasses
import importlib.util
import inspect
import types
from pathlib import Path

import pytest
import torch

from llama31_405b.config import load_config
from llama31_405b.config.load import ConfigError
from llama31_405b.config.validate import validate
from llama31_405b.precision import te_recipe

REPO = Path(__file__).resolve().parents[1]
GB200 = sorted((REPO / "configs").glob("config_GB200_*.toml"))
GB200_128 = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"


@pytest.fixture
def gpu_with_te(monkeypatch):
    """builder on a (pretend) GPU machine with Transformer Engine 2.20.2 and Apex's
    fused_weight_gradient_mlp_cuda installed (the project's image): only what
    TransformerConfig.__post_init__ asks of TE is stood in for (TE's fused RoPE function and
    its version); Apex's masked-softmax kernels are absent (tests/helpers/pretend_gpu.py)."""
    from helpers.pretend_gpu import pretend_gpu_with_te
    return pretend_gpu_with_te(monkeypatch)


@pytest.mark.parametrize("path", GB200, ids=[p.stem for p in GB200])
def test_gb200_gpu_transformer_config_is_accepted_by_megatron(gpu_with_te, path):
    """TransformerConfig, DDP config and optimizer config of every GB200 config, built by
    megatron-core 0.19.2 (each __post_init__ validates): NVFP4 compute with BF16 parameters
    gathered in BF16, BF16 gradient buckets of 134,217,728 elements, per-token loss (so no
    average_in_collective), full-iteration CUDA graphs (no per-layer scope, no NaN check in the
    captured pass), the rule-derived AdamW."""
    cfg = load_config(path)
    t = gpu_with_te.transformer_config(cfg)      # megatron's __post_init__ validates it
    assert (t.fp4, t.fp4_recipe, t.fp4_param, t.fp8, t.fp8_param) == ("e2m1", "nvfp4", False,
                                                                       None, False)
    assert not t.first_last_layers_bf16 and not t.fp8_dot_product_attention
    assert t.cuda_graph_impl == "full_iteration" and t.cuda_graph_modules == []
    assert t.use_te_rng_tracker and t.calculate_per_token_loss
    assert not t.tp_comm_overlap and t.sequence_parallel
    assert t.overlap_p2p_comm and not t.batch_p2p_comm           # interleaved (VP 8)
    assert t.apply_rope_fusion and t.bf16 and t.params_dtype == torch.bfloat16
    d = gpu_with_te.ddp_config(cfg)      # interleaved: the schedule dispatches the gathers
    assert d.overlap_param_gather and d.align_param_gather
    assert not d.fp4_param_gather and not d.fp8_param_gather      # BF16 parameter all-gather
    assert not d.grad_reduce_in_fp32 and d.bucket_size == 134_217_728
    assert not d.average_in_collective and not d.check_for_nan_in_grad
    o = gpu_with_te.optimizer_config(cfg)
    assert (o.lr, o.min_lr, o.clip_grad) == (cfg.derived.lr, cfg.derived.end_lr, 1.0)
    assert o.use_distributed_optimizer and o.bf16 and o.overlap_param_gather
    assert t.gradient_accumulation_fusion == cfg.performance.gradient_accumulation_fusion
    assert not t.masked_softmax_fusion   # Apex's softmax kernels absent


def test_gb200_full_iteration_graphs_are_accepted_by_megatron(gpu_with_te):
    from llama31_405b.model.builder import graph_capture_iteration
    cfg = load_config(GB200_128, validate=False,
                      overrides={"performance": {"cuda_graphs": "full_iteration"},
                                 "run": {"warmup_iters": 3}})
    t = gpu_with_te.transformer_config(cfg)
    assert t.cuda_graph_impl == "full_iteration" and t.cuda_graph_modules == []
    assert t.cuda_graph_warmup_steps == graph_capture_iteration(cfg) == 2
    assert t.use_te_rng_tracker        # graph-safe RNG states, registered with the graph


def test_gradient_accumulation_fusion_follows_the_config_and_the_image(gpu_with_te,
                                                                        monkeypatch):
    on = load_config(GB200_128, overrides={"performance": {"gradient_accumulation_fusion": True}})
    off = load_config(GB200_128, overrides={"performance": {"gradient_accumulation_fusion": False}})
    assert gpu_with_te.transformer_config(on).gradient_accumulation_fusion
    assert not gpu_with_te.transformer_config(off).gradient_accumulation_fusion
    # an image without Apex's extension: refused naming the key, before Megatron (whose
    # ColumnParallelLinear raises only while the model is being built)
    monkeypatch.setattr(gpu_with_te, "_has_module", lambda name: name == "transformer_engine")
    with pytest.raises(gpu_with_te.GpuSetupError,
                       match="gradient_accumulation_fusion.*fused_weight_gradient_mlp_cuda"):
        gpu_with_te.transformer_config(on)
    assert not gpu_with_te.transformer_config(off).gradient_accumulation_fusion
    from llama31_405b.systems.device import CPU     # the CPU has no fused kernels: off
    assert not gpu_with_te.transformer_config(on, device=CPU).gradient_accumulation_fusion


def test_fp8_gpu_transformer_config_with_bf16_edges_is_accepted(gpu_with_te):
    """fp8 compute with BF16 edge layers: current scaling (megatron refuses delayed scaling
    with BF16 edge layers), FP8 parameters, FP8 attention."""
    cfg = load_config(GB200_128, overrides={
        "precision": {"compute": "fp8", "attention": "fp8", "bf16_layers_at_start": 1,
                      "bf16_layers_at_end": 2},
        "performance": {"fp4_param_gather": False, "fp8_param_gather": True}})
    t = gpu_with_te.transformer_config(cfg)
    assert (t.fp8, t.fp8_recipe, t.fp8_param, t.fp4) == ("hybrid", "tensorwise", True, None)
    assert t.first_last_layers_bf16 and (t.num_layers_at_start_in_bf16,
                                         t.num_layers_at_end_in_bf16) == (1, 2)
    assert t.fp8_dot_product_attention


def test_gpu_without_te_refuses_te_settings_and_builds_plain_bf16(gpu_with_te, monkeypatch):
    monkeypatch.setattr(gpu_with_te, "_has_module", lambda name: False)
    with pytest.raises(RuntimeError, match="Transformer Engine"):
        gpu_with_te.transformer_config(load_config(GB200_128))
    spec = importlib.util.spec_from_file_location("gpu_layer", REPO / "bench" / "gpu_layer.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cfg = load_config(GB200_128, validate=False, overrides=bench.shard_overrides("h200-sxm"))
    t = gpu_with_te.transformer_config(cfg)
    assert not t.apply_rope_fusion and not t.gradient_accumulation_fusion
    assert not t.persist_layer_norm      # WrappedTorchNorm refuses it (test_gpu_model_build.py)
    assert gpu_with_te.layer_spec(cfg, te=False).submodules.self_attention is not None


def _cfg(**over):
    return load_config(GB200_128, validate=False, overrides=over)


def test_userbuffer_modes_follow_megatron_and_refuse_nvfp4():
    on = {"tp_comm_overlap": True}
    with pytest.raises(te_recipe.RecipeEnvError, match="NVFP4"):
        te_recipe.ub_quantization_modes(_cfg(performance=on))
    with pytest.raises(te_recipe.RecipeEnvError, match="tp_comm_overlap = true"):
        te_recipe.ub_quantization_modes(load_config(GB200_128))
    fp8 = {"compute": "fp8", "nvfp4_rht": False}
    assert te_recipe.ub_quantization_modes(_cfg(precision=fp8, performance=on)) == ["FP8"]
    assert te_recipe.ub_quantization_modes(
        _cfg(precision={**fp8, "bf16_layers_at_end": 2}, performance=on)) == ["FP8", "NONE"]
    assert te_recipe.ub_quantization_modes(
        _cfg(precision={"compute": "bf16"}, performance=on)) == ["NONE"]


def test_validate_refuses_nvfp4_tp_overlap_and_accepts_full_iteration_graphs():
    with pytest.raises(ConfigError, match="tp_comm_overlap"):
        validate(_cfg(performance={"tp_comm_overlap": True}))
    validate(_cfg(performance={"cuda_graphs": "full_iteration"}))
    validate(_cfg(performance={"cuda_graphs": "layers"}))


def test_recipe_states_no_rule_of_its_own():
    """te_recipe refuses what the validator refuses, with the validator's words (each TE or
    Megatron constraint is stated once, in config/validate_gpu.py)."""
    from llama31_405b.config import problems
    for over in ({"performance": {"fp4_param_gather": True}},                 # 1D weights
                 {"performance": {"fp8_param_gather": True}},                 # nvfp4 compute
                 {"precision": {"attention": "fp8"}, "env": {"NVTE_DPA_FP8_RECIPE": "F16"}},
                 {"precision": {"compute": "bf16", "attention": "fp8"}}):
        cfg = _cfg(**over)
        found = problems(cfg)
        assert found, over
        with pytest.raises(te_recipe.RecipeEnvError) as e:
            te_recipe.transformer_config_kwargs(cfg)
        assert any(p in str(e.value) for p in found), (over, str(e.value))
    src = inspect.getsource(te_recipe)
    assert "NVFP4 2D quantization" not in src and "NVFP4_FP8_ATTENTION_RECIPES" not in src


def test_megatron_refuses_what_the_cuda_graph_rules_refuse(gpu_with_te):
    """Per-layer graphs with full recomputation: megatron-core's TransformerConfig raises, and
    config check refuses the config first."""
    cfg = _cfg(performance={"cuda_graphs": "layers", "recompute": "full"})
    with pytest.raises(ConfigError, match='recompute = "full" with cuda_graphs = "layers"'):
        validate(cfg)
    with pytest.raises(AssertionError, match="full recompute is only supported with full iteration"):
        gpu_with_te.transformer_config(cfg)
    full = _cfg(performance={"recompute": "full"})
    validate(full)
    assert gpu_with_te.transformer_config(full).recompute_granularity == "full"


def test_full_iteration_constraints_as_megatron_states_them(gpu_with_te):
    """The megatron-core 0.19.2 sources behind config/validate_gpu.py's CUDA-graph rules and the
    builder settings a full-iteration capture needs."""
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.training import arguments
    # validate_args: no NaN check with full-iteration graphs; NCCL_GRAPH_REGISTER=0 with
    # expandable segments (per-layer graphs)
    args_src = inspect.getsource(arguments.validate_args)
    assert "--no-check-for-nan-in-loss-and-grad should be set with --cuda-graph-impl=full_iteration" in args_src
    assert "NCCL_GRAPH_REGISTER" in args_src and "expandable_segments:True" in args_src
    # DDP: per-token loss refuses average_in_collective
    assert "Cannot average in collective when calculating per-token loss!" in inspect.getsource(
        DistributedDataParallel.__init__)
    # batched P2P synchronises the device: the non-interleaved builder setting the rule refuses
    comm_src = inspect.getsource(P2PCommunicator._communicate)
    assert "config.batch_p2p_comm and config.batch_p2p_sync" in comm_src
    assert "torch.cuda.synchronize()" in comm_src
    vp1 = _cfg(parallel={"vp": 1})
    with pytest.raises(ConfigError, match="PP > 1 and VP = 1"):
        validate(vp1)
    t = gpu_with_te.transformer_config(_with_graphs(vp1, "none"))
    assert t.batch_p2p_comm and t.batch_p2p_sync
    for path in GB200:
        assert not gpu_with_te.ddp_config(load_config(path)).check_for_nan_in_grad


def _with_graphs(cfg, mode):
    return dataclasses.replace(cfg, performance=dataclasses.replace(cfg.performance,
                                                                    cuda_graphs=mode))


def test_fp4_param_gather_reaches_te_s_2d_only_cast():
    """megatron-core 0.19.2 casts the master weights into NVFP4 parameters through TE's
    quantize_master_weights (DistributedOptimizer._copy_main_params_to_model_params ->
    fp4_utils.quantize_nvfp4_param_shard), whose NVFP4 branch in TE 2.20.2 refuses 1D blocks:
    what the fp4_param_gather rule encodes."""
    from megatron.core import fp4_utils
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    assert "quantize_nvfp4_param_shard" in inspect.getsource(
        DistributedOptimizer._copy_main_params_to_model_params)
    assert "quantize_master_weights" in inspect.getsource(fp4_utils.quantize_nvfp4_param_shard)
    te = importlib.util.find_spec("transformer_engine")
    if te is not None and te.submodule_search_locations:     # the GPU image: TE's own source
        src = (Path(list(te.submodule_search_locations)[0]) / "pytorch" / "tensor" / "utils.py"
               ).read_text()
        fn = src[src.index("def _cast_master_weights_to_nvfp4_2d"):]
        assert 'raise ValueError("NVFP4 2D quantization must be enabled.")' in fn[:3000]
    with pytest.raises(ConfigError, match="nvfp4_2d_weights"):
        validate(_cfg(performance={"fp4_param_gather": True}))
    validate(_cfg(performance={"fp4_param_gather": True}, precision={"nvfp4_2d_weights": True}))


def test_validate_follows_megatrons_param_gather_rules():
    with pytest.raises(ConfigError, match="overlap_grad_reduce"):
        validate(_cfg(performance={"overlap_grad_reduce": False}))
    with pytest.raises(ConfigError, match="fp8/fp4_param_gather needs optimizer.distributed"):
        validate(_cfg(optimizer={"distributed": False}, precision={"nvfp4_2d_weights": True},
                      performance={"overlap_param_gather": False, "fp4_param_gather": True}))


def test_nvfp4_fp8_attention_needs_a_dpa_recipe():
    """launch_env gives FP8 attention under NVFP4 a TE FP8 recipe; a config [env] that takes it
    away (or names one TE cannot use there) is refused."""
    kw = te_recipe.transformer_config_kwargs(_cfg(precision={"attention": "fp8"}))
    assert kw["fp8_dot_product_attention"] and kw["fp4"] == "e2m1"
    for bad in ("F16", ""):
        with pytest.raises(te_recipe.RecipeEnvError, match="NVTE_DPA_FP8_RECIPE"):
            te_recipe.transformer_config_kwargs(
                _cfg(precision={"attention": "fp8"}, env={"NVTE_DPA_FP8_RECIPE": bad}))
    kw = te_recipe.transformer_config_kwargs(
        _cfg(precision={"attention": "fp8"}, env={"NVTE_DPA_FP8_RECIPE": "DelayedScaling"}))
    assert kw["fp8_dot_product_attention"]


class _FakeQuantized:
    """Stands in for a TE quantized tensor: what is_te_quantized looks at."""
    __module__ = "transformer_engine.pytorch.tensor.nvfp4_tensor"
    shape, dtype, device = torch.Size((4, 6)), torch.bfloat16, torch.device("cpu")

    def dequantize(self):
        return torch.zeros(self.shape)


def test_quantized_parameters_load_checkpoint_values_as_master_weights():
    sharded = {"model": {"w": types.SimpleNamespace(data=_FakeQuantized()),
                         "b": types.SimpleNamespace(data=torch.ones(3))}}
    assert te_recipe.high_precision_load_targets(sharded) == 1
    w = sharded["model"]["w"].data
    assert type(w) is torch.Tensor and w.shape == (4, 6) and w.dtype == torch.bfloat16
    assert torch.equal(sharded["model"]["b"].data, torch.ones(3))

    lin = torch.nn.Linear(6, 4)
    lin.weight._high_precision_init_val = torch.zeros(4, 6)   # TE keeps the random init here
    lin.weight.get_high_precision_init_val = types.MethodType(
        lambda p: p._high_precision_init_val, lin.weight)
    ckpt = {"weight": torch.randn(4, 6, dtype=torch.bfloat16), "bias": torch.randn(4)}
    assert te_recipe.keep_checkpoint_master_values(lin, ckpt) == 1
    assert torch.equal(lin.weight.get_high_precision_init_val(), ckpt["weight"])
    assert not hasattr(lin.bias, "_high_precision_init_val")
    with pytest.raises(te_recipe.RecipeEnvError, match="shape"):
        te_recipe.keep_checkpoint_master_values(lin, {"weight": torch.zeros(2, 2)})
    with pytest.raises(te_recipe.RecipeEnvError, match="quantized"):
        te_recipe.keep_checkpoint_master_values(lin, {"weight": _FakeQuantized()})
    plain = torch.nn.Linear(6, 4)                              # CPU / BF16 parameters: no-op
    assert te_recipe.keep_checkpoint_master_values(plain, plain.state_dict()) == 0


def test_microbatch_calculator_for_cuda_graph_capture():
    from megatron.core import num_microbatches_calculator as nmc

    from llama31_405b.train.step import configure_num_microbatches
    cfg = load_config(GB200_128)
    try:
        assert configure_num_microbatches(cfg, rank=1) == cfg.batch.minibs // cfg.batch.micro_batch_size
        assert nmc.get_num_microbatches() == 144
    finally:
        nmc.unset_num_microbatches_calculator()


def test_megatron_apis_the_gpu_loop_calls_exist():
    """Signatures of the megatron-core 0.19.2 calls in train/loop.py's and train/graphs.py's
    GPU branches."""
    from megatron.core.distributed import DistributedDataParallel as DDP
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper, StaticBufferLoader
    from megatron.core.transformer.cuda_graphs import TECudaGraphHelper
    wrap = inspect.signature(FullCudaGraphWrapper.__init__).parameters
    assert {"forward_backward_func", "cuda_graph_warmup_steps", "use_single_mempool"} <= set(wrap)
    assert set(FullCudaGraphWrapper.cuda_graph) == set(StaticBufferLoader.static_buffers) == {
        "training", "validation"}
    assert set(FullCudaGraphWrapper.curr_iteration) == set(FullCudaGraphWrapper.result) == {
        "training", "validation"}
    assert callable(FullCudaGraphWrapper.reset_cuda_graph)
    init = inspect.signature(TECudaGraphHelper.__init__).parameters
    assert {"model", "config", "seq_length", "micro_batch_size", "optimizers"} <= set(init)
    assert callable(TECudaGraphHelper.create_cudagraphs)
    assert callable(TECudaGraphHelper.cuda_graph_set_manual_hooks)
    assert "param_sync" in inspect.signature(DDP.disable_forward_pre_hook).parameters
    assert callable(DDP.enable_forward_pre_hook)


def test_context_parallel_split_uses_the_cp_group():
    """CP > 1 only runs on GPU (TE attention); the batch split it feeds is checked here on a
    fake 8-rank world (TP2 x CP2 x DP2, this process = rank 5): the sequence is cut in 2*CP
    chunks and CP rank r keeps chunks r and 2*CP-1-r (megatron's load-balanced causal split),
    tokens, labels and positions alike, and the split follows the CP group, not the world."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from llama31_405b.train.step import _to_device
    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=5, world_size=8)
    try:
        ps.initialize_model_parallel(tensor_model_parallel_size=2, context_parallel_size=2,
                                     create_gloo_process_groups=False)
        r = ps.get_context_parallel_rank()
        s = torch.arange(16)[None]
        out = _to_device({"tokens": s, "labels": s + 100, "loss_mask": torch.ones(1, 16),
                          "position_ids": s}, cp=2, gpu=False)
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()
    want = torch.tensor([[4 * r + i for i in range(4)] + [4 * (3 - r) + i for i in range(4)]])
    assert torch.equal(out["tokens"], want) and torch.equal(out["position_ids"], want)
    assert torch.equal(out["labels"], want + 100) and out["loss_mask"].shape == (1, 8)
