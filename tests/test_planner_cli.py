"""`python -m llama31_405b plan`: prediction, sweep, JSON fields, explain PNG, bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from llama31_405b.cli import main

FIELDS = {"tp", "pp", "vp", "cp", "dp", "minibs", "gbs", "step_time_s", "time_to_train_min", "mfu",
          "memory_per_gpu_gb", "fits", "samples_to_converge", "steps", "breakdown"}
BREAKDOWN = {"compute_qkv_s", "compute_attention_s", "compute_proj_s", "compute_ffn_up_s",
             "compute_ffn_down_s", "compute_logits_s", "tp_s", "cp_s", "pp_s", "dp_s", "bubble_s",
             "optimizer_s"}


def run(capsys, *argv):
    rc = main(["plan", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_layout_prediction_json(capsys):
    rc, out, _ = run(capsys, "--system", "gb200-nvl72", "--racks", "128", "--tp", "4", "--pp", "8",
                     "--vp", "8", "--cp", "2", "--minibs", "8", "--json")
    assert rc == 0
    d = json.loads(out)
    assert FIELDS <= set(d) and BREAKDOWN <= set(d["breakdown"])
    assert (d["tp"], d["pp"], d["vp"], d["cp"], d["dp"], d["minibs"], d["gbs"]) == (4, 8, 8, 2, 128, 8, 1024)
    assert d["step_time_s"] == pytest.approx(1.27, rel=1e-6)


def test_sweep_json_and_table(capsys):
    rc, out, _ = run(capsys, "--racks", "40", "--tp", "4", "--json", "--top", "3")
    assert rc == 0
    d = json.loads(out)
    assert d["candidates"] >= d["fitting"] > 0 and len(d["results"]) == 3
    assert all(FIELDS <= set(r) and r["tp"] == 4 for r in d["results"])
    rc, out, _ = run(capsys, "--racks", "40", "--cp", "2", "--top", "5")
    assert rc == 0 and "TP4-PP8" in out and "ranked by predicted time-to-train" in out


def test_existing_config_file(capsys):
    path = Path(__file__).resolve().parents[1] / "configs" / "config_GB200_640x4x24xtp4pp8cp2.toml"
    rc, out, _ = run(capsys, "--config", str(path))
    assert rc == 0 and "TP4-PP8-VP8-CP2 DP40 MiniBS 24" in out and "time-to-train" in out


@pytest.mark.slow      # sweeps 11 scales and draws the PNG (~15 s)
def test_explain_writes_table_and_png(capsys, tmp_path):
    png = tmp_path / "scaling.png"
    rc, out, _ = run(capsys, "--explain", "--out", str(png))
    assert rc == 0 and png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "eff@40" in out and "100%" in out  # 40 racks is the reference
    assert out.count("\n") >= 13


def test_bad_input_is_rejected_with_reasons(capsys):
    rc, _, err = run(capsys, "--tp", "4")
    assert rc == 2 and "--racks" in err
    rc, _, err = run(capsys, "--racks", "8", "--tp", "3", "--pp", "8", "--vp", "8", "--cp", "2",
                     "--minibs", "8")
    assert rc == 2 and "does not divide" in err
    rc, _, err = run(capsys, "--system", "tpu", "--racks", "8")
    assert rc == 2 and "unknown system id" in err
    # TP2-PP8-CP2 does not fit a GB200: reported, exit 0 for an explicit layout
    rc, out, _ = run(capsys, "--racks", "64", "--tp", "2", "--pp", "8", "--vp", "8", "--cp", "2",
                     "--minibs", "8")
    assert rc == 0 and "DOES NOT FIT" in out
