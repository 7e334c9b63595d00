"""Eight-GPU systems (DGX B200, HGX H200, HGX H100): systems as data, the layout rules the
validator takes from the system, the launch plan, the planner (sweep, --nodes, the published DGX
B200 run), and the configs it writes."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from statistics import median

import pytest

from llama31_405b.config import load_config
from llama31_405b.config.validate import problems
from llama31_405b.launch import launch_plan
from llama31_405b.planner import make_config, predict
from llama31_405b.planner.sweep import sweep
from llama31_405b.systems import load_system
from llama31_405b.systems import HERE as SYSTEMS

REPO = Path(__file__).resolve().parents[1]
EIGHT = ("dgx-b200", "h200-sxm", "h100-sxm")
NAMES = {"DGXB200": "dgx-b200", "H200": "h200-sxm", "H100": "h100-sxm"}
CONFIGS = sorted(p for p in (REPO / "configs").glob("config_*.toml")
                 if p.name.split("_")[1] in NAMES)


# --- systems as data --------------------------------------------------------------------------

@pytest.mark.parametrize("system", EIGHT)
def test_eight_gpu_systems_are_data_with_sources(system):
    s = load_system(system)
    assert s.node_nvlink_domain and s.gpus_per_nvlink_domain == s.gpus_per_node == 8
    assert s.gpus_used_per_rack == 8 and s.is_gpu
    assert s.nvfp4 == ("native" if system == "dgx-b200" else "none")
    text = (SYSTEMS / f"{system}.toml").read_text()
    assert "Sources:" in text and "datasheet" in text
    # every value that is not a name is sourced: a comment on its line or a header source
    assert s.peak_tflops_fp8 > 0 and s.scaleout_gbs == 50.0 and s.nvlink_gbs > 0


def test_nvl72_systems_keep_their_multi_node_domain():
    for system in ("gb200-nvl72", "gb300-nvl72", "cpu"):
        assert not load_system(system).node_nvlink_domain
    assert load_system("cpu-node8").node_nvlink_domain


# --- layout rules from the system -------------------------------------------------------------

def layout(system, nodes, **kw):
    return make_config(system, nodes, **{"tp": 4, "pp": 8, "vp": 8, "cp": 2, "minibs": 144, **kw})


def test_dgx_b200_published_layout_spans_nodes():
    cfg = layout("dgx-b200", 32, precision="fp8")
    assert problems(cfg) == []
    d = cfg.derived
    assert (d.dp, d.gbs, d.nodes, d.world_size) == (4, 576, 32, 256)
    assert (d.replicas_per_rack, d.racks_per_replica, d.segment_nodes) == (0, 8, 8)


@pytest.mark.parametrize("kw,nodes,words", [
    (dict(tp=16, pp=4, cp=1), 32, "TP group must lie inside one 8-GPU"),
    (dict(tp=4, pp=3, cp=1, vp=1, minibs=12), 24, "a model replica either fits one"),
    (dict(tp=4, pp=8, cp=2), 36, "do not hold whole model replicas"),
])
def test_node_rules_refuse(kw, nodes, words):
    found = problems(layout("h200-sxm", nodes, **kw))
    assert any(words in m for m in found), found


def test_cp_may_span_nodes_only_in_whole_nodes():
    assert problems(layout("h100-sxm", 512, pp=16, cp=4, minibs=64)) == []  # TP4 x CP4 = 2 nodes
    cfg = layout("h100-sxm", 512, pp=16, cp=4, minibs=64)
    assert cfg.derived.segment_nodes == 32 and cfg.derived.dp == 16


def test_gb200_rules_unchanged():
    assert layout("gb200-nvl72", 128, minibs=8).derived.dp == 128
    gb300 = make_config("gb300-nvl72", 128, tp=2, pp=8, vp=8, cp=2, minibs=8)
    assert gb300.derived.dp == 256 and gb300.derived.segment_nodes == 16
    wide = problems(make_config("gb200-nvl72", 8, tp=4, pp=16, vp=8, cp=2, minibs=144))
    assert any("would span racks" in m for m in wide)


def test_racks_of_hosts_and_partial_nodes_are_refused_on_node_systems(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'base = "{REPO / "configs/config_DGXB200_32x8x144xtp4pp8cp2.toml"}"\n'
                   '[system]\ngpus_per_rack = 4\n')
    with pytest.raises(Exception, match="a rack .NVLink domain. is one node"):
        load_config(cfg)
    cfg.write_text(f'base = "{REPO / "configs/config_DGXB200_32x8x144xtp4pp8cp2.toml"}"\n'
                   '[system.rack_of_host]\n"n*" = "r0"\n')
    with pytest.raises(Exception, match="rack_of_host"):
        load_config(cfg)


# --- launcher ---------------------------------------------------------------------------------

def test_launch_segment_follows_the_system():
    dgx = launch_plan(load_config(REPO / "configs/config_DGXB200_32x8x144xtp4pp8cp2.toml"))
    assert (dgx.nodes, dgx.tasks_per_node, dgx.nodes_per_rack) == (32, 8, 8)
    assert "--segment 8, the nodes of one model-parallel group" in dgx.local_error
    gb = launch_plan(load_config(REPO / "configs/config_GB200_2048x4x8xtp4pp8cp2.toml"))
    assert gb.nodes_per_rack == 16 and "--segment 16, the nodes of one NVLink domain" in gb.local_error


def test_run_and_time_launches_an_eight_gpu_config_unchanged(tmp_path):
    """The batch script as Slurm starts it for 32 DGX B200 nodes (DRY_RUN prints the srun lines):
    8 tasks per node with their share of the node's CPUs, the pre-flight on all 256 ranks."""
    import os
    cfg = "configs/config_DGXB200_32x8x144xtp4pp8cp2.toml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CONT", "NEXP"))}
    env.update(PYTHONPATH=str(REPO), PYTHON=sys.executable, CONFIG=cfg, DRY_RUN="1", NEXP="1",
               SEED_BASE="5", DATADIR="/lustre/data", CKPTDIR="/lustre/ckpt", LOGDIR=str(tmp_path),
               SLURM_JOB_ID="9", SLURM_JOB_NUM_NODES="32", SLURM_JOB_NODELIST="dgx[001-032]",
               SLURM_CPUS_ON_NODE="224", SLURM_GPUS_ON_NODE="8", SLURM_SUBMIT_DIR=str(REPO))
    p = subprocess.run(["bash", str(REPO / "run_and_time.sh")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    sruns = [ln for ln in p.stderr.splitlines() if ln.startswith("+ srun")]
    preflight = [ln for ln in sruns if "launch preflight" in ln]
    assert len(preflight) == 1
    assert "--nodes=32 --ntasks=256 --ntasks-per-node=8 --cpus-per-task=28" in preflight[0]
    assert any("llama31_405b train --config " + cfg in ln for ln in sruns)


# --- planner ----------------------------------------------------------------------------------

@pytest.mark.parametrize("system,nodes", [("dgx-b200", 32), ("dgx-b200", 56), ("h200-sxm", 64),
                                          ("h200-sxm", 128), ("h100-sxm", 512), ("h100-sxm", 1024)])
def test_plan_returns_fitting_layouts(system, nodes):
    ranked = sweep(system, nodes)
    fits = [p for p in ranked if p.fits]
    assert fits and ranked[0].fits and fits[0].simulated
    ttt = [p.time_to_train_min for p in fits if p.simulated]
    assert ttt == sorted(ttt)
    assert all(p.nodes == nodes and 8 % p.tp == 0 for p in fits)
    assert fits[0].precision == ("nvfp4" if system == "dgx-b200" else "fp8")


def test_pipeline_and_wide_cp_cross_the_scaleout_network():
    from llama31_405b.planner.context import Context
    from llama31_405b.planner.topology import NVLINK, SCALEOUT, cp_span, p2p_link
    dgx = Context.of(layout("dgx-b200", 32))
    assert [p2p_link(dgx, r) for r in range(8)] == [SCALEOUT] * 8  # one stage per node
    assert cp_span(dgx).across == 1                                  # TP4 x CP2 = one node
    h100 = Context.of(layout("h100-sxm", 512, pp=16, cp=4, minibs=64))
    assert cp_span(h100).across == 2                                 # CP4 over 2 nodes
    gb = Context.of(layout("gb200-nvl72", 128, minibs=8))
    assert {p2p_link(gb, r) for r in range(8)} == {NVLINK}


def test_fp8_and_nvfp4_weights_in_memory():
    """NVFP4 (the configs): BF16 weights gathered, plus row- and column-wise NVFP4 copies, 3.125
    bytes per parameter; FP8 with the FP8 parameter gather: 1 byte."""
    nv = predict(layout("dgx-b200", 32)).memory["weights_gb"]
    f8 = predict(layout("dgx-b200", 32, precision="fp8")).memory["weights_gb"]
    assert nv / f8 == pytest.approx(2 + 2 * 0.5625)


def test_published_dgx_b200_step_within_10_percent_of_its_logs():
    """The University of Florida's DGX B200 run (MLPerf Training v5.1, 32 nodes, FP8,
    TP4-PP8-CP2, MiniBS 144): the logs are a test of the model, never an input."""
    from mlperf_logs import LOGS, need_fixture

    from llama31_405b.mlperf.log import load_run
    need_fixture()
    steps = [median(s for _, s in load_run(p).step_times()[1][1:]) for p in LOGS]
    measured = sum(steps) / len(steps)
    assert 27 < measured < 28.5
    p = predict(layout("dgx-b200", 32, precision="fp8"))
    assert (p.dp, p.gbs, p.nodes, p.fits) == (4, 576, 32, True)
    assert abs(p.step_time_s / measured - 1) < 0.10, (p.step_time_s, measured)


def test_plan_cli_takes_nodes():
    out = subprocess.run([sys.executable, "-m", "llama31_405b", "plan", "--system", "dgx-b200",
                          "--nodes", "32", "--tp", "4", "--pp", "8", "--vp", "8", "--cp", "2",
                          "--minibs", "144", "--precision", "fp8"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("dgx-b200, 32 nodes: TP4-PP8-VP8-CP2 DP4 MiniBS 144")
    bad = subprocess.run([sys.executable, "-m", "llama31_405b", "plan", "--nodes", "100"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "16 node(s) per rack" in bad.stderr
    js = subprocess.run([sys.executable, "-m", "llama31_405b", "plan", "--system", "h100-sxm",
                         "--nodes", "1024", "--tp", "4", "--pp", "16", "--cp", "4", "--json",
                         "--top", "2"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert js.returncode == 0, js.stderr
    data = json.loads(js.stdout)
    assert data["nodes"] == data["racks"] == 1024 and data["results"][0]["fits"]


# --- configs ----------------------------------------------------------------------------------

NAME = re.compile(r"config_(DGXB200|H200|H100)_(\d+)x8x(\d+)xtp(\d+)pp(\d+)cp(\d+)\.toml")


def test_configs_for_every_eight_gpu_system():
    assert {p.name.split("_")[1] for p in CONFIGS} == set(NAMES)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_eight_gpu_config_names_values_and_checks(path):
    m = NAME.fullmatch(path.name)
    assert m, path.name
    prefix, nodes, minibs, tp, pp, cp = m.group(1), *map(int, m.groups()[1:])
    cfg = load_config(path)
    d = cfg.derived
    assert cfg.system.id == NAMES[prefix] and cfg.system.racks == nodes == d.nodes
    assert (cfg.batch.minibs, cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.cp) == (minibs, tp, pp, cp)
    assert cfg.precision.compute == ("nvfp4" if prefix == "DGXB200" else "fp8")
    assert predict(cfg).fits


@pytest.mark.parametrize("cmd", [["config", "check"], ["compliance", "precheck"]])
def test_config_check_and_precheck_pass_every_eight_gpu_config(cmd):
    r = subprocess.run([sys.executable, "-m", "llama31_405b", *cmd, *map(str, CONFIGS)], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    word = "ok  " if cmd[0] == "config" else "PASS"
    assert sum(line.startswith(word) for line in r.stdout.splitlines()) == len(CONFIGS)
