"""The first-contact command (llama31_405b.first_contact): on a machine without a GPU every
check is reported "not run" with its reason and the exit status is 0; the recipe choice follows
the GPU's compute capability; the one-GPU slice of a GB200 config is a valid one-rank config at
405B width that Megatron accepts and that fits one H200; without Transformer Engine the slice
runs Megatron's local layers in BF16 (Megatron accepts it on a GPU) and only the TE checks are
"not run"; the report is written as it goes and a phase that does not fit the time budget is
"not run"; the no-TE path runs on the CPU through every check the CPU allows, the DP 2 phase
included; the layer phase's FLOP count and planner prediction."""
import dataclasses
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from llama31_405b.config import load_config
from llama31_405b.config.derived import param_count
from llama31_405b import first_contact as fc

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
    assert f"0 failed, 0 passed, {len(fc.CHECKS)} not run" in err


def test_recipe_follows_the_compute_capability():
    assert fc.choose_recipe("nvfp4", (10, 0))[0] == "nvfp4"
    compute, why = fc.choose_recipe("nvfp4", (9, 0))          # H200
    assert compute == "fp8" and "no NVFP4 hardware" in why and "9.0 < 10.0" in why
    assert fc.choose_recipe("nvfp4", (8, 0)) == (None, "no NVFP4 or FP8 hardware (compute "
                                                        "capability 8.0 < 8.9)")
    assert fc.choose_recipe("nvfp4", None)[0] is None


def test_a_gpu_without_transformer_engine_runs_the_local_bf16_slice(monkeypatch):
    import builtins
    import os

    import torch

    import llama31_405b.systems.device as device
    from llama31_405b.model import builder
    from llama31_405b.first_contact import checks
    monkeypatch.setattr(os, "environ", dict(os.environ))     # run_checks exports launch_env
    monkeypatch.setattr(device, "cuda_visible", lambda: True)
    props = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=141 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    # what torch reports free on an idle H200 (module fit compares the slice's estimate with it)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=0: (139 * 2**30, 140 * 2**30))
    from llama31_405b.first_contact import fit     # and its host's (a test H200's 128 GiB)
    monkeypatch.setattr(fit, "host_available", lambda: 120 * 2**30)
    real_import = builtins.__import__

    def no_te(name, *a, **k):
        if name.startswith("transformer_engine"):
            raise ModuleNotFoundError("No module named 'transformer_engine'")
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_te)
    seen = {}

    def fake_slice(rep, scfg, tmp, *, te):
        seen.update(scfg=scfg, te=te)
    monkeypatch.setattr(checks, "_run_slice", fake_slice)
    rep = fc.run_checks(GB200)
    got = {n: (c.status, c.detail) for n, c in rep.checks.items()}
    assert got["gpu"][0] == "passed" and "H200" in got["gpu"][1]
    assert got["transformer_engine"][0] == "not run" and "not installed" in got["transformer_engine"][1]
    assert "local layers in BF16" in got["transformer_engine"][1]
    assert got["recipe"] == ("not run", "needs Transformer Engine")
    # the GB200 config asks for Apex's fusion, which a bare image lacks: not a failure there
    assert got["gradient_accumulation_fusion"][0] == "not run" and "Apex" in got["gradient_accumulation_fusion"][1]
    assert got["dp2_eval_sync"] == ("not run", "needs 2 GPUs (this machine has 1)")
    assert rep.failures == 0
    fits = rep.checks["build"].data               # the slice's estimate fits one H200
    assert fits["memory_estimate_gib"]["gpu"] < fits["memory_available_gib"]["gpu"] == 139
    scfg = seen["scfg"]
    assert seen["te"] is False and scfg.precision.compute == "bf16"
    assert scfg.model.seq_length == fc.LOCAL_SEQ_LENGTH and scfg.model.hidden_size == 16384
    assert scfg.performance.cuda_graphs == "full_iteration"
    assert not scfg.performance.gradient_accumulation_fusion
    assert scfg.system.id == "h200-sxm" and scfg.derived.lr == fc.SLICE_LR
    # what the GPU would build: Megatron's local spec, a TransformerConfig it accepts
    gpu = device.Device(gpu=True, system="h200-sxm", cuda_visible=True)
    monkeypatch.setattr(builder, "_has_module", lambda name: False)
    t = builder.transformer_config(scfg, device=gpu)
    assert t.cuda_graph_impl == "full_iteration" and t.bf16 and t.fp8 is None and t.fp4 is None
    spec = builder.layer_spec(scfg, device=gpu)
    linear = spec.submodules.self_attention.submodules.linear_qkv
    assert linear.__module__.startswith("megatron.core.tensor_parallel")
    assert os.environ["NVTE_DPA_FP8_RECIPE"] == "F16"           # set before TE would load


def test_the_rules_learning_rate_would_move_no_bf16_weight():
    """Why the slice sets its own LR: the rules' first update at GBS 2 is far below BF16's
    resolution of a weight of the init scale."""
    import torch

    from llama31_405b.train.schedule import LRSchedule
    cfg = load_config(GB200)
    s = fc.slice_config(cfg, compute="bf16", layers=1, seq_length=2048, steps=3,
                        system="h200-sxm", ckpt_dir="/tmp/x", gaf=False)
    rules = dataclasses.replace(s, optimizer=cfg.optimizer)
    w = torch.tensor(0.02, dtype=torch.bfloat16)
    assert w + LRSchedule.from_config(rules).lr_at(0) == w
    assert w + LRSchedule.from_config(s).lr_at(0) != w
    assert LRSchedule.from_config(s).lr_at(2) == fc.SLICE_LR


def test_the_report_is_written_as_it_goes_and_honours_the_budget(tmp_path):
    path = tmp_path / "r.json"
    rep = fc.Report(path=path, budget_s=0.0, meta={"config": "x"})
    assert json.loads(path.read_text())["summary"] == {"passed": 0, "failed": 0,
                                                       "not run": len(fc.CHECKS)}
    rep.passed("gpu", "H200", name="NVIDIA H200")
    doc = json.loads(path.read_text())
    assert doc["checks"][0] == {"name": "gpu", "status": "passed", "detail": "H200",
                                "seconds": 0.0, "data": {"name": "NVIDIA H200"}}
    assert not rep.afford(fc.PHASES["slice"], 60, "the slice")
    doc = json.loads(path.read_text())
    by = {c["name"]: c for c in doc["checks"]}
    assert all(by[n]["detail"].startswith("time budget: 0 s left") for n in fc.PHASES["slice"])
    assert by["layer_bf16"]["detail"] == ""
    assert set(n for names in fc.PHASES.values() for n in names) <= set(fc.CHECKS)


def test_layer_phase_flops_and_planner_prediction():
    from llama31_405b.config.schema import ModelConfig
    from llama31_405b.planner.compute import flops_by_part
    from llama31_405b.first_contact import layer
    m = ModelConfig(seq_length=4096, num_layers=1)
    by = flops_by_part(m)
    assert layer.layer_flops(m) == {k: v for k, v in by.items() if k != "logits"}
    shard = dataclasses.replace(m, num_attention_heads=32, num_query_groups=2,
                                ffn_hidden_size=13312)
    assert sum(layer.layer_flops(shard).values()) == pytest.approx(
        sum(layer.layer_flops(m).values()) / 4)
    full, part = layer.planner_layer("h200-sxm", "full"), layer.planner_layer("h200-sxm", "tp4_shard")
    assert full["bwd_s"] == pytest.approx(2 * full["fwd_s"], rel=0.1)   # dgrad + wgrad
    assert full["fwd_s"] + full["bwd_s"] == pytest.approx(4 * (part["fwd_s"] + part["bwd_s"]), rel=0.1)
    # the H200's BF16 datasheet peak bounds what the planner predicts
    assert sum(by.values()) - by["logits"] < 990e12 * (full["fwd_s"] + full["bwd_s"])


@pytest.mark.slow
def test_the_local_path_runs_on_the_cpu_through_every_check_it_allows(tmp_path):
    """The no-TE path end to end on the CPU (tiny config, gloo): build, checkpoint save and
    load, warm-up and restore, replay vs eager (both eager here), steps, evaluation, and the DP 2
    phase with the distributed optimizer and the overlapped gather on two gloo ranks."""
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "llama31_405b", "first-contact", "--cpu",
                        "--config", str(REPO / "configs" / "tiny_cpu.toml"), "--steps", "2",
                        "--phases", "layer,slice,dp2", "--report", str(report), "--json"],
                       cwd=REPO, env=py_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(report.read_text())
    by = {c["name"]: c for c in doc["checks"]}
    assert by == {c["name"]: c for c in json.loads(r.stdout)}
    for name in fc.PHASES["slice"] + fc.PHASES["dp2"]:
        assert by[name]["status"] == "passed", (name, by[name])
    assert by["recipe"]["detail"] == "needs Transformer Engine"
    assert {by[n]["detail"] for n in fc.PHASES["layer"]} == {"needs CUDA"}
    assert by["replay_equals_eager"]["data"]["grads_bitwise"] is True
    assert all(x["weights_synchronised"] for x in by["dp2_eval_sync"]["data"]["ranks"])
    # a replayed training step after an optimizer step used the synchronised weights (eager on
    # the CPU: the pre-hooks gather; on two GPUs the training graph's captured gathers)
    assert all(x["train_replay_synchronised"] for x in by["dp2_eval_sync"]["data"]["ranks"])
    assert "a replayed training step gathered" in by["dp2_eval_sync"]["detail"]
    assert len(by["steps"]["data"]["losses"]) == 2
    assert doc["summary"]["failed"] == 0


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


@pytest.mark.gpu
@pytest.mark.slow
def test_on_a_gpu_the_slice_passes(tmp_path):
    """On a GPU (with or without Transformer Engine): the slice and the layer phase pass (a few
    minutes on one H200; the prepared H200 command runs the same with time limits)."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible)")
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "llama31_405b", "first-contact", "--phases",
                        "layer,slice,dp2", "--report", str(report), "--traceback"],
                       cwd=REPO, env=py_env(), capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-5000:]
    by = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    for name in fc.PHASES["slice"] + fc.PHASES["layer"]:
        assert by[name]["status"] == "passed", (name, by[name])


def test_the_dp2_weight_hash_sees_one_changed_element():
    """dp2.param_hash is what tells stale weights from synchronised ones: any one BF16 element
    of a buffer moved by one unit in the last place changes its bucket's hash, and only that."""
    import torch

    from llama31_405b.first_contact.dp2 import param_hash
    g = torch.Generator().manual_seed(0)
    bufs = [types.SimpleNamespace(param_data=(torch.randn(n, generator=g) * 0.02).to(torch.bfloat16))
            for n in (1000, 3000)]
    model = [types.SimpleNamespace(buffers=bufs)]
    before = param_hash(model)
    assert before.shape == (2,) and torch.equal(before, param_hash(model))
    d = bufs[1].param_data
    d.view(torch.int16)[1234] += 1                    # one unit in the last place
    after = param_hash(model)
    assert after[0] == before[0] and after[1] != before[1]
