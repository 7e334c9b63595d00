"""Every shipped config is valid, and each GB200 file name states the values inside it."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llama31_405b.config import load_config
from llama31_405b.config.rules import LLAMA31_405B

REPO = Path(__file__).resolve().parents[1]

CONFIGS = sorted((REPO / "configs").glob("*.toml"))
GB200 = [p for p in CONFIGS if p.name.startswith("config_GB200_")]
NAME = re.compile(r"config_GB200_(\d+)x(\d+)x(\d+)xtp(\d+)pp(\d+)cp(\d+)\.toml")


def test_configs_exist():
    assert {"tiny_cpu.toml", "tiny_cpu_2racks.toml"} <= {p.name for p in CONFIGS}
    racks = sorted(load_config(p).system.racks for p in GB200)
    assert racks == [8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128]


@pytest.mark.parametrize("path", GB200, ids=lambda p: p.name)
def test_gb200_name_matches_values(path):
    m = NAME.fullmatch(path.name)
    assert m, f"{path.name} does not follow config_GB200_<NODES>x4x<MINIBS>xtp<T>pp<P>cp<C>.toml"
    nodes, per_node, minibs, tp, pp, cp = map(int, m.groups())
    cfg = load_config(path)
    d = cfg.derived
    assert (d.nodes, d.system.gpus_per_node, cfg.batch.minibs) == (nodes, per_node, minibs)
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.cp) == (tp, pp, cp)
    assert cfg.parallel.vp == 8 and cfg.precision.compute == "nvfp4"
    assert d.dp == cfg.system.racks and d.gbs <= LLAMA31_405B.max_gbs


def test_published_minibs():
    by_racks = {load_config(p).system.racks: load_config(p).batch.minibs for p in GB200}
    assert (by_racks[8], by_racks[40], by_racks[112], by_racks[128]) == (144, 24, 8, 8)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "llama31_405b", *args], cwd=REPO,
                          capture_output=True, text=True)


def test_config_check_cli_passes_every_shipped_config():
    r = _cli("config", "check", *map(str, CONFIGS))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("ok ") == len(CONFIGS)


def test_config_check_cli_fails_with_reason(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(f'base = "{REPO}/configs/tiny_cpu.toml"\n[batch]\nminbs = 8\n')
    r = _cli("config", "check", str(bad))
    assert r.returncode != 0
    assert "batch.minbs" in r.stderr and "did you mean 'minibs'" in r.stderr


def test_config_show_json_has_derived_fields():
    r = _cli("config", "show", str(REPO / "configs/config_GB200_2048x4x8xtp4pp8cp2.toml"), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)["derived"]
    for key in ("dp", "gbs", "nodes", "lr", "warmup_steps", "decay_steps", "eval_interval_steps",
                "first_eval_step", "gradient_accumulation_steps", "model_flops_per_sequence"):
        assert key in d
    assert (d["dp"], d["gbs"], d["nodes"], d["first_eval_step"]) == (128, 1024, 2048, 270)


# --- issue 13: what every GB200 config runs with ---------------------------------------------

@pytest.mark.parametrize("path", GB200, ids=lambda p: p.name)
def test_gb200_runs_the_proven_settings(path):
    """As `config show --json` prints them: a capped run (<= 1000 steps, the max_steps rule of
    config/rcp.py), BF16 parameter gather, BF16 gradient reduction, full-iteration CUDA graphs."""
    from llama31_405b.cli.config_cmd import resolved
    from llama31_405b.config.rcp import max_steps_for
    data = json.loads(json.dumps(resolved(load_config(path))))
    c, d = data["config"], data["derived"]
    assert d["max_steps"] <= 1000 and d["max_steps"] == c["run"]["max_steps"]
    assert d["max_steps"] == max_steps_for("llama31_405b", d["gbs"])
    assert d["max_steps"] >= d["first_eval_step"]
    perf, prec = c["performance"], c["precision"]
    assert not perf["fp4_param_gather"] and not perf["fp8_param_gather"] and prec["params"] == "bf16"
    assert not prec["grad_reduce_in_fp32"]
    assert perf["cuda_graphs"] == "full_iteration"
    assert perf["ddp_bucket_size"] == 134_217_728 and perf["manual_gc_interval"] == 1000
    assert perf["gradient_accumulation_fusion"]


def test_config_show_json_gives_the_cap():
    r = _cli("config", "show", str(REPO / "configs/config_GB200_128x4x144xtp4pp8cp2.toml"), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["derived"]["max_steps"] == data["config"]["run"]["max_steps"] == 500
    assert data["derived"]["gbs"] == 1152


def test_tiny_configs_follow_the_max_steps_rule():
    from llama31_405b.config.rcp import max_steps_for
    for p in CONFIGS:
        if p.name.startswith("tiny_"):
            cfg = load_config(p)
            assert cfg.run.max_steps == max_steps_for(cfg.run.benchmark, cfg.derived.gbs) == 350


BASE_REASONED = ("grad_reduce_in_fp32", "cuda_graphs", "fp4_param_gather", "ddp_bucket_size",
                 "gradient_accumulation_fusion", "manual_gc_interval")


def test_base_gives_a_reason_for_each_proven_setting():
    lines = (REPO / "configs" / "base" / "gb200_405b.toml").read_text().splitlines()
    for key in BASE_REASONED:
        line = next(x for x in lines if x.startswith(f"{key} ="))
        assert "#" in line and len(line.split("#", 1)[1].strip()) > 20, line
