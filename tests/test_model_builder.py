"""Model builder: Llama 3.1 RoPE, the Megatron configs of the 128-rack GB200 config, and the
405B model of one pipeline stage on the meta device."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.coverage_env import coverage_env
from llama31_405b.config import load_config
from llama31_405b.config.derived import param_count
from llama31_405b.config.schema import ModelConfig
from llama31_405b.model.rope import llama31_inv_freq

REPO = Path(__file__).resolve().parents[1]
GB200_128 = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"


def _hf_llama3_inv_freq(m: ModelConfig) -> torch.Tensor:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    hf = LlamaConfig(hidden_size=m.num_attention_heads * m.kv_channels,
                     num_attention_heads=m.num_attention_heads, head_dim=m.kv_channels,
                     rope_theta=m.rope_base, max_position_embeddings=131072,
                     rope_scaling={"rope_type": "llama3", "factor": m.rope_scaling_factor,
                                   "low_freq_factor": m.rope_low_freq_factor,
                                   "high_freq_factor": m.rope_high_freq_factor,
                                   "original_max_position_embeddings": m.rope_original_max_positions})
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    return inv.float()


@pytest.mark.parametrize("over", [{}, {"rope_low_freq_factor": 2.0, "rope_high_freq_factor": 8.0,
                                       "rope_original_max_positions": 4096,
                                       "rope_scaling_factor": 16.0}])
def test_rope_matches_reference_llama3_formula(over):
    m = ModelConfig(**over)
    ours = llama31_inv_freq(m)
    ref = _hf_llama3_inv_freq(m)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=0)
    # all three regimes are exercised: untouched, interpolated, divided by the factor
    base = 1.0 / (m.rope_base ** (torch.arange(0, m.kv_channels, 2).float() / m.kv_channels))
    ratio = base / ours
    assert (ratio == 1).any() and (torch.isclose(ratio, torch.tensor(m.rope_scaling_factor))).any()
    assert ((ratio > 1.001) & (ratio < m.rope_scaling_factor - 1e-3)).any()


def test_rope_without_scaling_is_plain():
    m = ModelConfig(rope_scaling=False, kv_channels=64, rope_base=10000.0)
    torch.testing.assert_close(llama31_inv_freq(m),
                               1.0 / 10000.0 ** (torch.arange(0, 64, 2).float() / 64))


def test_gb200_128_rack_megatron_configs_carry_layout_and_performance():
    from llama31_405b.model.builder import ddp_config, optimizer_config, transformer_config
    from llama31_405b.systems.device import CPU
    cfg = load_config(GB200_128)
    t = transformer_config(cfg, device=CPU)      # config-level: on this machine, no GPU
    assert (t.tensor_model_parallel_size, t.pipeline_model_parallel_size,
            t.virtual_pipeline_model_parallel_size, t.context_parallel_size) == (4, 8, 8, 2)
    assert t.sequence_parallel and t.account_for_embedding_in_pipeline_split
    assert t.account_for_loss_in_pipeline_split
    assert (t.num_layers, t.hidden_size, t.ffn_hidden_size, t.num_attention_heads,
            t.num_query_groups, t.kv_channels) == (126, 16384, 53248, 128, 8, 128)
    assert t.normalization == "RMSNorm" and t.layernorm_epsilon == 1e-5
    assert t.gated_linear_unit and t.activation_func is torch.nn.functional.silu
    assert not t.add_bias_linear and not t.add_qkv_bias
    assert t.hidden_dropout == 0 and t.attention_dropout == 0
    assert t.bf16 and t.params_dtype == torch.bfloat16 and t.calculate_per_token_loss
    assert t.cuda_graph_impl == "full_iteration"
    assert cfg.parallel.order == "tp-cp-ep-pp-dp"
    d = ddp_config(cfg)
    assert d.use_distributed_optimizer and d.overlap_grad_reduce and d.overlap_param_gather
    assert not d.grad_reduce_in_fp32 and d.bucket_size == 134_217_728      # BF16 buckets
    assert not d.fp4_param_gather and not d.fp8_param_gather and not d.average_in_collective
    o = optimizer_config(cfg)
    assert o.optimizer == "adam" and o.decoupled_weight_decay
    assert o.lr == cfg.derived.lr and o.lr * 1152 == cfg.derived.gbs * 8e-5
    assert (o.adam_beta1, o.adam_beta2, o.adam_eps, o.weight_decay, o.clip_grad) == (
        0.9, 0.95, 1e-5, 0.1, 1.0)
    assert o.use_distributed_optimizer and o.overlap_param_gather and o.bf16


META_SCRIPT = r"""
import json, sys, torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from llama31_405b import cpu_compat
cpu_compat.apply()
from llama31_405b.config import load_config
# the CPU (local) layer spec has no sequence-parallel norm, and NVFP4 on CPU swaps in emulated
# linears; neither changes parameter counts. The fake process group takes no NCCL options.
cfg = load_config(sys.argv[1], overrides={"parallel": {"sequence_parallel": False},
                                          "precision": {"compute": "bf16"},
                                          "performance": {"nccl_communicator_config": None}},
                  validate=False)
d = cfg.derived
world = d.model_parallel_size          # one model replica: TP4 x PP8 x CP2 = 64 ranks
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
from megatron.core import parallel_state as ps
from llama31_405b.parallel.setup import megatron_parallel_kwargs
ps.initialize_model_parallel(**megatron_parallel_kwargs(cfg), create_gloo_process_groups=False)
from llama31_405b.model.builder import build_model, transformer_config
from llama31_405b.systems.device import CPU
import dataclasses
# CP shards activations, not parameters; Megatron's CPU attention refuses CP > 1, so the layers
# are built with CP 1 inside the TP4-PP8-VP8-CP2 process layout.
tcfg = dataclasses.replace(transformer_config(cfg, device=CPU), context_parallel_size=1,
                           use_cpu_initialization=False, perform_initialization=False)
with torch.device("meta"):
    torch.cuda.current_device = lambda: "meta"   # megatron passes device= explicitly
    chunks = build_model(cfg, config=tcfg, device=CPU)
n = sum(q.numel() for c in chunks for q in c.parameters())
devs = sorted({str(q.device) for c in chunks for q in c.parameters()})
layers = [len(c.decoder.layers) for c in chunks]
print(json.dumps({"params": n, "devices": devs, "layers": layers,
                  "pre": [c.pre_process for c in chunks], "post": [c.post_process for c in chunks]}))
"""


@pytest.mark.slow
def test_405b_first_pipeline_stage_on_meta_matches_analytic_count(tmp_path):
    script = tmp_path / "meta.py"
    script.write_text(META_SCRIPT)
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **coverage_env()}
    r = subprocess.run([sys.executable, str(script), str(GB200_128)], capture_output=True,
                       text=True, timeout=600, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    cfg = load_config(GB200_128)
    m, d, tp = cfg.model, cfg.derived, cfg.parallel.tp
    assert got["devices"] == ["meta"]
    # rank 0 = pipeline stage 0: 8 virtual chunks; chunk 0 = embedding + 1 layer, the others 2
    assert got["layers"] == [1] + [2] * 7
    assert got["pre"] == [True] + [False] * 7 and got["post"] == [False] * 8
    h, q, kv = m.hidden_size, m.num_attention_heads * m.kv_channels, m.num_query_groups * m.kv_channels
    per_layer_tp = (h * (q + 2 * kv) + q * h + 3 * h * m.ffn_hidden_size) // tp + 2 * h
    expected = 15 * per_layer_tp + d.padded_vocab_size // tp * h
    assert got["params"] == expected
    # and the per-layer term is the analytic param_count's, sharded over TP
    one_layer = param_count(ModelConfig(num_layers=1), vocab=0) - h   # minus the final norm
    assert per_layer_tp == (one_layer - 2 * h) // tp + 2 * h
