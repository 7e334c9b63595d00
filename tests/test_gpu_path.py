"""The GPU-only code paths, checked on CPU against the installed megatron-core 0.19.2: the
TransformerConfig the GB200 configs produce on a GPU with Transformer Engine, the TE userbuffer
modes, the FP8/FP4-parameter checkpoint load, the microbatch calculator the CUDA-graph capture
reads, and the megatron APIs the training loop calls there."""
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
    its version); Apex's masked-softmax kernels are absent."""
    from packaging.version import Version

    import llama31_405b.model.builder as builder
    import llama31_405b.systems.device as device
    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.core.transformer.transformer_config as tc_mod
    te = Version("2.20.2")
    monkeypatch.setattr(device, "cuda_visible", lambda: True)
    monkeypatch.setattr(builder, "_has_module",
                        lambda name: name in ("transformer_engine", builder.GRAD_ACCUM_FUSION_MODULE))
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda *a, **k: None)
    monkeypatch.setattr(tc_mod, "is_te_min_version",
                        lambda v, check_equality=True: te >= Version(v) if check_equality
                        else te > Version(v))
    monkeypatch.setattr(tc_mod, "get_te_version", lambda: te)
    return builder


@pytest.mark.parametrize("path", GB200, ids=[p.stem for p in GB200])
def test_gb200_gpu_transformer_config_is_accepted_by_megatron(gpu_with_te, path):
    cfg = load_config(path)
    t = gpu_with_te.transformer_config(cfg)      # megatron's __post_init__ validates it
    perf = cfg.performance
    assert (t.fp4, t.fp4_recipe, t.fp4_param, t.fp8, t.fp8_param) == (
        "e2m1", "nvfp4", perf.fp4_param_gather, None, False)
    assert not t.first_last_layers_bf16 and not t.fp8_dot_product_attention
    impl = {"layers": "transformer_engine", "full_iteration": "full_iteration"}[perf.cuda_graphs]
    assert t.cuda_graph_impl == impl and t.cuda_graph_modules == [] and t.use_te_rng_tracker
    if perf.cuda_graphs == "layers":
        assert t.cuda_graph_warmup_steps == cfg.run.warmup_iters
    assert not t.tp_comm_overlap and t.sequence_parallel
    assert t.overlap_p2p_comm and not t.batch_p2p_comm           # interleaved (VP 8)
    assert t.apply_rope_fusion and t.bf16 and t.params_dtype == torch.bfloat16
    d = gpu_with_te.ddp_config(cfg)      # interleaved: the schedule dispatches the gathers
    assert d.overlap_param_gather and d.align_param_gather
    assert d.fp4_param_gather == perf.fp4_param_gather
    assert t.gradient_accumulation_fusion == perf.gradient_accumulation_fusion
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
    assert gpu_with_te.layer_spec(cfg, te=False).submodules.self_attention is not None


def _cfg(**over):
    return load_config(GB200_128, validate=False, overrides=over)


def test_userbuffer_modes_follow_megatron_and_refuse_nvfp4():
    with pytest.raises(te_recipe.RecipeEnvError, match="NVFP4"):
        te_recipe.ub_quantization_modes(load_config(GB200_128))
    fp8 = {"compute": "fp8", "nvfp4_rht": False}
    assert te_recipe.ub_quantization_modes(_cfg(precision=fp8)) == ["FP8"]
    assert te_recipe.ub_quantization_modes(
        _cfg(precision={**fp8, "bf16_layers_at_end": 2})) == ["FP8", "NONE"]
    assert te_recipe.ub_quantization_modes(_cfg(precision={"compute": "bf16"})) == ["NONE"]


def test_validate_refuses_nvfp4_tp_overlap():
    with pytest.raises(ConfigError, match="tp_comm_overlap"):
        validate(_cfg(performance={"tp_comm_overlap": True}))


def test_validate_follows_megatrons_param_gather_rules():
    with pytest.raises(ConfigError, match="overlap_grad_reduce"):
        validate(_cfg(performance={"overlap_grad_reduce": False}))
    with pytest.raises(ConfigError, match="fp8/fp4_param_gather needs optimizer.distributed"):
        validate(_cfg(optimizer={"distributed": False},
                      performance={"overlap_param_gather": False}))


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


class _TEStyleNorm(torch.nn.Module):
    """Like TE's RMSNorm (an ops BasicOperation): a weight plus an `_extra_state` entry."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))
        self.got = "unset"

    def get_extra_state(self):
        return torch.empty(0, dtype=torch.uint8)

    def set_extra_state(self, state):
        self.got = state


def test_gpu_model_loads_a_checkpoint_without_te_extra_state():
    """The GPU model's final norm is TE's RMSNorm, which has an `_extra_state` the CPU-converted
    checkpoint (PyTorch norm) does not hold; it is filled with None ("no stored state")."""
    from llama31_405b.train.checkpoint import fill_absent_extra_states
    m = torch.nn.Module()
    m.final_layernorm, m.lin = _TEStyleNorm(), torch.nn.Linear(4, 4)
    ckpt = {"final_layernorm.weight": torch.full((4,), 2.0), "lin.weight": torch.zeros(4, 4),
            "lin.bias": torch.zeros(4)}
    with pytest.raises(RuntimeError, match="final_layernorm._extra_state"):
        m.load_state_dict(ckpt, strict=True)
    state = fill_absent_extra_states(m, ckpt)
    m.load_state_dict(state, strict=True)
    assert m.final_layernorm.got is None and float(m.final_layernorm.weight[0]) == 2.0
    assert set(state) - set(ckpt) == {"final_layernorm._extra_state"}
