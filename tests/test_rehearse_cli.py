"""End-to-end rehearsals through `python -m llama31_405b rehearse` (slow: every rank is a
process of its own that builds its stages of the 405B model on the meta device): the 8- and 128-rack GB200 configs pass on their
first, a middle and the last pipeline stage; the planner's weights, gradients and optimizer
state agree with Megatron's buffers on every shipped GB200 config; the rehearsal refuses the
whole LR schedule as max_steps, an allocation that interleaves two racks, and a layout that does
not fit in memory."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llama31_405b.config import load_config
from llama31_405b.rehearse.ranks import default_ranks

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
C128 = CONFIGS / "config_GB200_128x4x144xtp4pp8cp2.toml"
C2048 = CONFIGS / "config_GB200_2048x4x8xtp4pp8cp2.toml"
GB200 = sorted(CONFIGS.glob("config_GB200_*.toml"))


def rehearse(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llama31_405b", "rehearse", *map(str, args),
                           "--jobs", "2"], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def first_middle_last(cfg) -> list[int]:
    ranks = default_ranks(cfg)
    return [ranks[0], ranks[len(ranks) // 2], ranks[-1]]


def check_rank(res: dict, cfg) -> None:
    p = cfg.parallel
    assert res["ok"], res.get("error")
    assert res["groups"]["tp"] == p.tp and res["groups"]["pp"] == p.pp
    assert res["groups"]["cp"] == p.cp and res["groups"]["dp"] == cfg.derived.dp
    layers = res["layers"]
    assert len(layers) == p.vp
    assert layers[0]["embedding"] == (res["coords"]["pp"] == 0)
    assert layers[-1]["output"] == (res["coords"]["pp"] == p.pp - 1)
    b, pl = res["bytes"], res["planner"]
    assert b["weights"] == b["grads"] >= 2 * res["params"]          # BF16 params and grads
    assert b["master_weights"] * 2 == b["optimizer_state"]          # FP32 master; Adam m, v
    for mine, theirs in ((b["weights"], pl["weights"]), (b["grads"], pl["grads"]),
                         (b["master_weights"] + b["optimizer_state"], pl["optimizer"])):
        assert theirs == pytest.approx(mine, rel=0.05)
    # the initial checkpoint: the converted TP1 chunks behind the rank's slice (BF16, every TP
    # slice whole: about TP x its BF16 weights), read once over the DP x CP group, at most one
    # chunk per rank when the group has more ranks than the slice has chunks
    rd = res["checkpoint_read"]
    assert rd["group_size"] == cfg.derived.dp * p.cp
    assert rd["slice_bytes"] == pytest.approx(p.tp * b["weights"], rel=0.05)
    assert rd["before_bytes"] == 2 * rd["slice_bytes"]
    assert rd["after_bytes"] <= rd["slice_bytes"] / rd["group_size"] + rd["largest_chunk"]


@pytest.mark.parametrize("path", [C128, C2048], ids=["8racks", "128racks"])
def test_gb200_config_rehearses_first_middle_and_last_stage(path):
    cfg = load_config(path)
    ranks = first_middle_last(cfg)
    r = rehearse(path, "--ranks", ",".join(map(str, ranks)), "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["failures"] == [] and rep["planner_check"] == []
    assert rep["world_size"] == cfg.derived.world_size and rep["placement"]["ok"]
    assert [res["rank"] for res in rep["ranks"]] == ranks
    for res in rep["ranks"]:
        check_rank(res, cfg)
    ds = rep["dataset"]
    assert ds["ok"] and ds["samples"] == cfg.derived.max_steps * cfg.derived.gbs
    assert ds["total_bytes"] < 1e9 and ds["build_s"] > 0
    header = {e["key"]: e["value"] for e in rep["header"]}
    assert header["max_steps"] == cfg.derived.max_steps and rep["precheck"]["ok"]


@pytest.mark.stress
def test_planner_memory_matches_megatron_on_every_shipped_gb200_config(tmp_path):
    """Weights (without TE's NVFP4 copies), gradients and optimizer state from Megatron's own
    buffers, against the planner: within 5%. One stage per config, first, middle and last in turn
    (the configs share the layout and differ in DP, which shards the optimizer state the same way
    on every stage; all three stages of the 128- and 2,048-rack configs are checked above, in
    `make test`). A sweep over nine configs: `make test-stress` runs it."""
    from llama31_405b.rehearse.run import Options, rehearse as run_rehearsal
    others = [p for p in GB200 if p not in (C128, C2048)]
    for i, path in enumerate(others):
        cfg = load_config(path)
        rank = first_middle_last(cfg)[i % 3]
        rep = run_rehearsal(str(path), Options(ranks=[rank], jobs=1, dataset=False))
        assert rep["planner_check"] == [], path.name
        for res in rep["ranks"]:
            check_rank(res, cfg)


def test_the_whole_schedule_as_max_steps_is_refused_by_the_index_bound(tmp_path):
    """Open division (no load-time data bound): the index of 1.2 M steps at GBS 1152 is refused
    by --max-index-gb, before anything is built. (Closed division: refused at load,
    tests/test_rehearse.py.)"""
    cfg = tmp_path / "schedule.toml"
    cfg.write_text(f'base = "{C128}"\n[run]\ndivision = "open"\nmax_steps = 1200000\n')
    r = rehearse(cfg, "--ranks", "0")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    verdict = r.stdout.strip().splitlines()[-1]
    assert verdict.startswith("verdict: FAIL") and "exceeds --max-index-gb 10" in verdict
    assert "1,200,000 steps x GBS 1152" in verdict
    assert "not built: larger than --max-index-gb" in r.stdout


def test_an_allocation_interleaving_two_racks_is_refused(tmp_path):
    lines = []
    for n in range(1, 17):
        lines += [f"r000n{n:02d} rack000", f"r001n{n:02d} rack001"]
    for rack in range(2, 8):
        lines += [f"r{rack:03d}n{n:02d} rack{rack:03d}" for n in range(1, 17)]
    alloc = tmp_path / "alloc.txt"
    alloc.write_text("\n".join(lines) + "\n")
    r = rehearse(C128, "--allocation", alloc)
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    assert "CP group ranks 0,4 spans racks" in r.stdout
    assert "verdict: FAIL: placement: placement check failed" in r.stdout


def test_a_layout_that_does_not_fit_is_refused(tmp_path):
    """TP2-PP8-CP2 on GB200 at MiniBS 16: twice TP4's weights, gradients and activations."""
    cfg = tmp_path / "tp2.toml"
    cfg.write_text(f'base = "{CONFIGS / "base" / "gb200_405b.toml"}"\n[parallel]\ntp = 2\n'
                   '[system]\nracks = 32\n[batch]\nminibs = 16\n[run]\nmax_steps = 400\n')
    middle = first_middle_last(load_config(cfg))[1]
    r = rehearse(cfg, "--ranks", str(middle))
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    verdict = r.stdout.strip().splitlines()[-1]
    assert f"rank {middle}: needs" in verdict and "does not fit in memory" in verdict
