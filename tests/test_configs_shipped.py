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
