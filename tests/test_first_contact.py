"""The first-contact command (llama31_405b.train.first_contact): on a machine without a GPU every
check is reported "not run" with its reason and the exit status is 0; the recipe choice follows
the GPU's compute capability; the one-GPU slice of a GB200 config is a valid one-rank config at
405B width that Megatron accepts and that fits one H200."""
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from llama31_405b.config import load_config
from llama31_405b.config.derived import param_count
from llama31_405b.train import first_contact as fc

from conftest import py_env

REPO = Path(__file__).resolve().parents[1]
GB200 = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"


def test_without_a_gpu_every_check_is_not_run_with_the_reason():
    r = subprocess.run([sys.executable, "-m", "llama31_405b", "first-contact", "--json"],
                       cwd=REPO, env=py_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    checks = json.loads(r.stdout)
    assert [c["name"] for c in checks] == list(fc.CHECKS)
    assert {c["status"] for c in checks} == {"not run"}
    assert all("no CUDA device visible" in c["detail"] for c in checks)


def test_text_report(monkeypatch, capsys):
    import argparse
    import os

    import llama31_405b.systems.device as device
    monkeypatch.setattr(os, "environ", dict(os.environ))     # run_checks exports launch_env
    monkeypatch.setattr(device, "cuda_visible", lambda: False)
    p = argparse.ArgumentParser()
    fc.add_arguments(p)
    assert fc.run(p.parse_args([])) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].split()[:3] == ["gpu", "not", "run"]
    assert "0 failed, 0 passed, 10 not run" in err


def test_recipe_follows_the_compute_capability():
    assert fc.choose_recipe("nvfp4", (10, 0))[0] == "nvfp4"
    compute, why = fc.choose_recipe("nvfp4", (9, 0))          # H200
    assert compute == "fp8" and "no NVFP4 hardware" in why and "9.0 < 10.0" in why
    assert fc.choose_recipe("nvfp4", (8, 0)) == (None, "no NVFP4 or FP8 hardware (compute "
                                                        "capability 8.0 < 8.9)")
    assert fc.choose_recipe("nvfp4", None)[0] is None


def test_a_gpu_without_transformer_engine_reports_it(monkeypatch):
    import builtins
    import os

    import torch

    import llama31_405b.systems.device as device
    monkeypatch.setattr(os, "environ", dict(os.environ))     # run_checks exports launch_env
    monkeypatch.setattr(device, "cuda_visible", lambda: True)
    props = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=141 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    real_import = builtins.__import__

    def no_te(name, *a, **k):
        if name.startswith("transformer_engine"):
            raise ImportError("No module named 'transformer_engine'")
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_te)
    rep = fc.run_checks(GB200)
    got = {n: (c.status, c.detail) for n, c in rep.checks.items()}
    assert got["gpu"][0] == "passed" and "H200" in got["gpu"][1]
    assert got["transformer_engine"][0] == "not run" and "not installed" in got["transformer_engine"][1]
    assert all(s == "not run" and d == "no Transformer Engine" for n, (s, d) in got.items()
               if n not in ("gpu", "transformer_engine"))
    assert rep.failures == 0
    assert os.environ["NVTE_DPA_FP8_RECIPE"] == "F16"           # set before TE would load


def test_the_slice_is_one_rank_at_405b_width_and_fits_one_h200(monkeypatch):
    cfg = load_config(GB200)
    s = fc.slice_config(cfg, compute="fp8", layers=1, seq_length=8192, steps=3,
                        system="h200-sxm", ckpt_dir="/tmp/x", gaf=False)
    d = s.derived
    assert d.world_size == 1 and d.dp == 1 and d.gbs == 2 and d.num_microbatches == 2
    m = s.model
    assert (m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.num_query_groups) == (
        16384, 53248, 128, 8)
    assert s.performance.cuda_graphs == "full_iteration" and s.run.warmup_iters >= 2
    assert s.precision.compute == "fp8" and not s.precision.nvfp4_2d_weights
    # parameters x (BF16 weight + FP32 grad + FP32 master + two FP32 Adam moments)
    assert param_count(m) * (2 + 4 + 4 + 8) / 2**30 < 75       # GiB, of 139 on one H200
    two = fc.slice_config(cfg, compute="fp8", layers=2, seq_length=8192, steps=3,
                          system="h200-sxm", ckpt_dir="/tmp/x", gaf=False)
    assert param_count(two.model) * 18 / 2**30 > 120          # why one layer is the default


def test_megatron_accepts_the_slice_on_a_gpu(monkeypatch):
    """The slice's TransformerConfig on a (pretend) GPU with TE 2.20.2, as tests/test_gpu_path.py
    checks the full configs."""
    from packaging.version import Version

    import llama31_405b.model.builder as builder
    import llama31_405b.systems.device as device
    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.core.transformer.transformer_config as tc_mod
    te = Version("2.20.2")
    monkeypatch.setattr(device, "cuda_visible", lambda: True)
    monkeypatch.setattr(builder, "_has_module", lambda name: name == "transformer_engine")
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda *a, **k: None)
    monkeypatch.setattr(tc_mod, "is_te_min_version",
                        lambda v, check_equality=True: te >= Version(v) if check_equality
                        else te > Version(v))
    monkeypatch.setattr(tc_mod, "get_te_version", lambda: te)
    for compute in ("fp8", "nvfp4"):
        s = fc.slice_config(load_config(GB200), compute=compute, layers=1, seq_length=8192,
                            steps=3, system=None, ckpt_dir="/tmp/x", gaf=False)
        t = builder.transformer_config(s)
        assert t.cuda_graph_impl == "full_iteration" and t.num_layers == 1
        assert (t.fp8 is not None) == (compute == "fp8") and (t.fp4 is not None) == (compute == "nvfp4")
        assert t.tensor_model_parallel_size == 1 and not t.sequence_parallel


@pytest.mark.parametrize("name,system", [("NVIDIA GB200", "gb200-nvl72"),
                                         ("NVIDIA H200", "h200-sxm")])
def test_system_of_the_gpu(name, system):
    assert next(s for key, s in fc._SYSTEM_OF_GPU if key in name.upper()) == system
