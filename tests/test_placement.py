"""Placement check: the pure function on cluster-sized worlds, rack detection, and the collective
on 4 gloo processes."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import zygote
from helpers.ports import free_port

from llama31_405b.config import load_config
from llama31_405b.config.env import launch_env
from llama31_405b.parallel.distributed import DistEnv
from llama31_405b.parallel.layout import Layout
from llama31_405b.parallel.placement import (Placement, PlacementError, detect_rack,
                                             error_message, find_violations, format_rack_map,
                                             rack_from_fabric_text, rack_from_override,
                                             rack_from_slurm_topology, rack_map)

REPO = Path(__file__).resolve().parents[1]
GB200 = Layout(tp=4, cp=2, pp=8, dp=128)          # 128 racks x 64 GPUs, 4 GPUs per node


def placements(layout: Layout, rack_of_node, gpus_per_node: int = 4) -> list[Placement]:
    out = []
    for r in range(layout.world_size):
        node = r // gpus_per_node
        out.append(Placement(rank=r, host=f"node{node:04d}", rack=f"r{rack_of_node(node)}",
                             source="test"))
    return out


def test_gb200_in_rank_order_is_clean():
    ps = placements(GB200, lambda n: n // 16)
    assert find_violations(GB200, ps) == []
    m = rack_map(GB200, ps)
    assert len(m) == 128 and m["r0"] == [0] and m["r127"] == [127]
    text = format_rack_map(GB200, ps)
    assert "128 rack(s)" in text and "rack r5: DP ranks 5 " in text


def test_gb200_interleaved_nodes_split_every_pipeline():
    ps = placements(GB200, lambda n: n % 128)      # consecutive nodes in different racks
    v = find_violations(GB200, ps)
    assert v[0].startswith("4096 CP group(s), 1024 PP group(s) span racks; 128 of 128")
    # TP groups stay on one node (4 GPUs), so only CP and PP groups are reported
    assert not any(line.startswith("TP group") for line in v)
    assert sum(line.startswith("PP group") for line in v) == 1024
    assert sum(line.startswith("CP group") for line in v) == 4096
    msg = error_message(v)
    assert "... and" in msg and "--segment" in msg


def test_two_swapped_nodes_are_named():
    def rack(n):                  # node 15 (end of rack 0) and node 16 (start of rack 1) swapped
        return {15: 1, 16: 0}.get(n, n // 16)
    ps = placements(GB200, rack)
    v = find_violations(GB200, ps)
    pp_lines = [line for line in v if line.startswith("PP group")]
    # ranks 60-63 (node0015) sit in rack r1: PP groups of replica 0 that include them
    assert pp_lines and all("node0015" in line for line in pp_lines[:1])
    assert any("ranks 60" in line or "60" in line for line in pp_lines)
    assert "2 of 128" in v[0]
    assert not any("different numbers" in line for line in v)


def test_uneven_racks_reported():
    lay = Layout(tp=1, cp=1, pp=2, dp=4)
    racks = ["a", "a", "a", "a", "a", "a", "b", "b"]     # groups fine, 6 vs 2 ranks
    ps = [Placement(rank=i, host=f"h{i}", rack=racks[i], source="test") for i in range(8)]
    v = find_violations(lay, ps)
    assert len(v) == 1 and v[0].startswith("racks hold different numbers of ranks: a: 6")


def test_tp_group_split_names_ranks_and_hosts():
    lay = Layout(tp=2, cp=1, pp=1, dp=2)
    ps = [Placement(rank=0, host="n1", rack="rack0", source="t"),
          Placement(rank=1, host="n2", rack="rack1", source="t"),
          Placement(rank=2, host="n3", rack="rack0", source="t"),
          Placement(rank=3, host="n4", rack="rack1", source="t")]
    v = find_violations(lay, ps)
    assert "TP group ranks 0-1 spans racks: rack rack0 (rank 0 on n1); rack rack1 (rank 1 on n2)" in v
    assert "TP group ranks 2-3 spans racks: rack rack0 (rank 2 on n3); rack rack1 (rank 3 on n4)" in v


def test_missing_ranks_reported():
    lay = Layout(tp=2, cp=1, pp=1, dp=2)
    ps = [Placement(rank=i, host="h", rack="r", source="t") for i in (0, 1, 3)]
    assert find_violations(lay, ps) == ["placement known for 3 ranks, layout has 4 (missing ranks 2)"]


def test_slurm_topology_address():
    tree = {"SLURM_TOPOLOGY_ADDR": "spine.rack1.n3", "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.switch.node"}
    assert rack_from_slurm_topology(tree) == "rack1"
    block = {"SLURM_TOPOLOGY_ADDR": "b07.gb200-0113", "SLURM_TOPOLOGY_ADDR_PATTERN": "block.node"}
    assert rack_from_slurm_topology(block) == "b07"
    assert rack_from_slurm_topology({"SLURM_TOPOLOGY_ADDR": "n3",
                                     "SLURM_TOPOLOGY_ADDR_PATTERN": "node"}) is None
    assert rack_from_slurm_topology({}) is None


FABRIC = """
==============NVSMI LOG==============
Attached GPUs                             : 2
GPU 00000008:01:00.0
    Product Name                          : NVIDIA GB200
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 32766
        ClusterUUID                       : 5f3a86f1-1b1c-4e41-9d7e-0123456789ab
        Health
            Bandwidth                     : Full
    Processes                             : None
GPU 00000009:01:00.0
    Product Name                          : NVIDIA GB200
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 32766
        ClusterUUID                       : 5f3a86f1-1b1c-4e41-9d7e-0123456789ab
"""

HGX = """
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H200
    Fabric
        State                             : N/A
        Status                            : N/A
        CliqueId                          : N/A
        ClusterUUID                       : N/A
"""


def test_fabric_clique_from_nvidia_smi():
    assert rack_from_fabric_text(FABRIC) == "5f3a86f1-1b1c-4e41-9d7e-0123456789ab/32766"
    assert rack_from_fabric_text(HGX) is None
    zero = FABRIC.replace("5f3a86f1-1b1c-4e41-9d7e-0123456789ab",
                          "00000000-0000-0000-0000-000000000000")
    assert rack_from_fabric_text(zero) is None
    assert rack_from_fabric_text("") is None


def test_override_wins_and_must_cover_every_host():
    env = {"SLURM_TOPOLOGY_ADDR": "spine.rack1.n3", "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.switch.node"}
    no_fabric = lambda lr: None  # noqa: E731
    fabric = lambda lr: "uuid/7"  # noqa: E731
    assert detect_rack("n3", {"n[13]": "A", "n[24]": "B"}, env, fabric=fabric) == ("A", "config")
    assert detect_rack("n3", {}, env, fabric=fabric) == ("uuid/7", "fabric")
    assert detect_rack("n3", {}, env, fabric=no_fabric) == ("rack1", "slurm-topology")
    assert detect_rack("n3", {}, {}, fabric=no_fabric) == ("n3", "host")
    assert rack_from_override("gb-r07-n3.cluster", {"gb-r07-*": "r07"}) == "r07"
    with pytest.raises(PlacementError, match="'n9' matches no key of system.rack_of_host"):
        rack_from_override("n9", {"n1": "A"})


def test_config_override_loads(tmp_path):
    cfg = load_config(REPO / "configs/tiny_cpu_2racks.toml",
                      overrides={"system": {"rack_of_host": {"n[12]": "rack0", "n[34]": "rack1"}}})
    assert cfg.system.rack_of_host == {"n[12]": "rack0", "n[34]": "rack1"}
    site = tmp_path / "site.toml"
    site.write_text(f'base = "{REPO / "configs/tiny_cpu_2racks.toml"}"\n'
                    '[system.rack_of_host]\n"gb200-r01-*" = "r01"\n"gb200-r02-*" = "r02"\n')
    cfg = load_config(site)
    assert cfg.system.rack_of_host == {"gb200-r01-*": "r01", "gb200-r02-*": "r02"}
    assert detect_rack("gb200-r02-n07", cfg.system.rack_of_host, {}) == ("r02", "config")


# --- the collective on 4 gloo processes ---------------------------------------------------------

def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from llama31_405b.parallel.distributed import init_process_group
    from llama31_405b.parallel.placement import check_placement
    cfg = load_config(REPO / "configs/tiny_cpu_2racks.toml")      # TP1 PP2 DP2, 2 racks of 2
    host = f"n{rank + 1}"
    de = DistEnv(rank=rank, world_size=4, local_rank=0, master_addr="127.0.0.1", master_port=port,
                 hostname=host, launcher="test")
    init_process_group(de, backend="gloo", timeout_s=60)
    results = []
    for layout_name, rack in (("block", f"rack{rank // 2}"), ("interleaved", f"rack{rank % 2}")):
        env = {"SLURM_TOPOLOGY_ADDR": f"spine.{rack}.{host}",
               "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.switch.node"}
        logged = []
        try:
            check_placement(cfg, de, environ=env, log=logged.append)
            results.append(f"{layout_name}: ok {len(logged)}\n" + "".join(logged))
        except PlacementError as e:
            results.append(f"{layout_name}: PlacementError\n{e}")
    dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.txt").write_text("\n---\n".join(results))


@pytest.mark.slow
def test_check_placement_gloo_4_ranks(tmp_path):
    # the ranks fork from the preloaded zygote (tests/helpers/zygote.py), not fresh interpreters
    zygote.spawn(_worker, (free_port(), str(tmp_path)), 4, check=True)
    texts = [(tmp_path / f"rank{r}.txt").read_text().split("\n---\n") for r in range(4)]
    # good placement: everyone passes; only rank 0 logs the rack -> DP mapping
    assert texts[0][0].startswith("block: ok 1\n")
    assert "rack rack0: DP ranks 0 (global ranks 0-1, 2 host(s): n1, n2)" in texts[0][0]
    assert "rack rack1: DP ranks 1 (global ranks 2-3" in texts[0][0]
    assert all(t[0] == "block: ok 0\n" for t in texts[1:])
    # interleaved racks: every rank raises the same message naming the PP group, ranks and hosts
    bad = {t[1] for t in texts}
    assert len(bad) == 1
    msg = bad.pop()
    assert msg.startswith("interleaved: PlacementError\nplacement check failed")
    assert ("PP group ranks 0-1 spans racks: rack rack0 (rank 0 on n1); "
            "rack rack1 (rank 1 on n2)") in msg
    assert ("PP group ranks 2-3 spans racks: rack rack0 (rank 2 on n3); "
            "rack rack1 (rank 3 on n4)") in msg


def test_world_size_mismatch_is_an_error():
    from llama31_405b.parallel.placement import check_placement
    cfg = load_config(REPO / "configs/tiny_cpu_2racks.toml")
    de = DistEnv(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1", master_port=1,
                 hostname="h", launcher="single")
    with pytest.raises(PlacementError, match="the job has 1 ranks but .* needs 4"):
        check_placement(cfg, de, environ={})


# --- GB200 multi-node NVLink readiness (parallel/fabric.py) -------------------------------------
# The `nvidia-smi -q` texts below are HAND-WRITTEN samples of the documented format (GPU header
# "GPU <bus id>", a "Fabric" section with State, Status, CliqueId, ClusterUUID and a Health
# subsection), not output captured on a GB200 machine.

BUS_IDS = ("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0")


def _gb200_node(states=("Completed",) * 4, statuses=("Success",) * 4, cliques=("7",) * 4,
                bandwidth="Full", uuid="5f3a86f1-1b1c-4e41-9d7e-0123456789ab") -> str:
    parts = ["==============NVSMI LOG==============", "",
             "Driver Version                            : 580.95.05", "Attached GPUs                             : 4"]
    for bus, state, status, clique in zip(BUS_IDS, states, statuses, cliques):
        parts += [f"GPU {bus}",
                  "    Product Name                          : NVIDIA GB200",
                  "    Fabric",
                  f"        State                             : {state}",
                  f"        Status                            : {status}",
                  f"        CliqueId                          : {clique}",
                  f"        ClusterUUID                       : {uuid}",
                  "        Health",
                  f"            Bandwidth                     : {bandwidth}",
                  "            Route Recovery in progress    : False",
                  "    Processes                             : None"]
    return "\n".join(parts) + "\n"


def test_parse_fabric_sections_per_gpu():
    from llama31_405b.parallel.fabric import parse_fabric
    gpus = parse_fabric(_gb200_node(states=("Completed", "In Progress", "Completed", "Completed"),
                                    cliques=("7", "N/A", "7", "7")))
    assert [g.gpu for g in gpus] == list(BUS_IDS)
    assert gpus[0].clique == "5f3a86f1-1b1c-4e41-9d7e-0123456789ab/7"
    assert (gpus[1].state, gpus[1].clique, gpus[1].bandwidth) == ("In Progress", None, "Full")
    # the Processes line after the section is not read as a fabric key
    assert all(g.status == "Success" for g in gpus)
    assert [g.clique for g in parse_fabric(HGX)] == [None]


def _node(text: str, channels=("channel0",)):
    from llama31_405b.parallel.fabric import NodeFabric, parse_fabric
    return NodeFabric(gpus=parse_fabric(text), channels=list(channels))


def test_mnnvl_ready_node_has_no_problems():
    from llama31_405b.parallel.fabric import mnnvl_problems, node_clique
    node = _node(_gb200_node())
    assert mnnvl_problems(node) == []
    assert node_clique(node, 3) == "5f3a86f1-1b1c-4e41-9d7e-0123456789ab/7"


def test_mnnvl_problems_name_each_missing_piece():
    from llama31_405b.parallel.fabric import NodeFabric, mnnvl_problems
    no_imex = mnnvl_problems(_node(_gb200_node(), channels=()))
    assert len(no_imex) == 1 and no_imex[0].startswith("no IMEX channel in /dev/nvidia-caps-imex-channels")
    pending = mnnvl_problems(_node(_gb200_node(states=("Completed", "In Progress", "Completed", "Completed"),
                                               statuses=("Success", "N/A", "Success", "Success"))))
    assert pending == ["GPU 00000009:01:00.0: fabric state In Progress, status N/A (needs Completed, "
                       "Success: the GPU is not registered in the NVLink fabric)"]
    split = mnnvl_problems(_node(_gb200_node(cliques=("7", "7", "8", "8"))))
    assert len(split) == 1 and "in 2 NVLink cliques" in split[0]
    degraded = mnnvl_problems(_node(_gb200_node(bandwidth="Degraded")))
    assert len(degraded) == 4 and "bandwidth Degraded" in degraded[0]
    zero = mnnvl_problems(_node(_gb200_node(uuid="00000000-0000-0000-0000-000000000000")))
    assert len(zero) == 4 and "without a cluster UUID" in zero[0]
    hgx = mnnvl_problems(_node(HGX))
    assert "fabric state N/A" in hgx[0]
    assert "no GPU with a Fabric section" in mnnvl_problems(_node(""))[0]
    two = mnnvl_problems(_node("\n".join(_gb200_node().splitlines()[:26])), gpus_needed=4)
    assert two == ["2 GPU(s) visible, the node runs 4 ranks (one per GPU): request them "
                   "(sbatch --gpus-per-node=4) where Slurm constrains devices"]
    assert "nvidia-smi must work" in mnnvl_problems(NodeFabric(error="nvidia-smi -q: not found"))[0]


def test_imex_channels_are_character_devices(tmp_path):
    from llama31_405b.parallel.fabric import imex_channels
    assert imex_channels(tmp_path / "absent") == []
    (tmp_path / "channel1").write_text("")                 # a regular file is no channel
    (tmp_path / "channel0").symlink_to("/dev/null")        # a character device is
    (tmp_path / "other").symlink_to("/dev/null")
    assert imex_channels(tmp_path) == ["channel0"]


def _gb200_cfg():
    return load_config(REPO / "configs/config_GB200_128x4x144xtp4pp8cp2.toml")


def test_gb200_rank_uses_its_clique_and_fails_without_imex():
    from llama31_405b.parallel.placement import local_placement
    cfg = _gb200_cfg()
    de = DistEnv(rank=5, world_size=512, local_rank=1, master_addr="x", master_port=1,
                 hostname="gb-r01-n02", launcher="slurm")
    env = launch_env(cfg)                        # what run_and_time.sh exports
    p = local_placement(cfg, de, env, probe=lambda: _node(_gb200_node()))
    assert (p.rack, p.source, p.clique) == ("5f3a86f1-1b1c-4e41-9d7e-0123456789ab/7", "fabric",
                                            "5f3a86f1-1b1c-4e41-9d7e-0123456789ab/7")
    with pytest.raises(PlacementError, match="no IMEX channel"):
        local_placement(cfg, de, env, probe=lambda: _node(_gb200_node(), channels=()))
    # CPU systems never probe the fabric
    tiny = load_config(REPO / "configs/tiny_cpu_2racks.toml")
    de1 = DistEnv(rank=0, world_size=4, local_rank=0, master_addr="x", master_port=1,
                  hostname="n1", launcher="slurm")
    assert local_placement(tiny, de1, {}, probe=lambda: 1 / 0).source == "host"


def test_gpu_rank_needs_the_configs_launch_env():
    """A rank started without the exports (srun by hand) or with an image's own value winning
    over the host's would run another recipe: it fails before any fabric probe."""
    from llama31_405b.parallel.placement import local_placement
    cfg = _gb200_cfg()
    de = DistEnv(rank=0, world_size=512, local_rank=0, master_addr="x", master_port=1,
                 hostname="h", launcher="slurm")
    env = dict(launch_env(cfg), NCCL_NVLS_ENABLE="1")
    del env["NVTE_NVFP4_DISABLE_RHT"]
    with pytest.raises(PlacementError) as e:
        local_placement(cfg, de, env, probe=lambda: 1 / 0)
    assert ("NCCL_NVLS_ENABLE=0 expected, found '1'; NVTE_NVFP4_DISABLE_RHT=1 expected, unset"
            in str(e.value)) and "--container-env" in str(e.value)


def test_rank_errors_are_grouped_with_the_fix():
    from llama31_405b.parallel.placement import evaluate
    lay = Layout(tp=4, cp=2, pp=8, dp=2)
    msg = "no IMEX channel in /dev/nvidia-caps-imex-channels (...)"
    gathered = [(r, f"node{r // 4:04d}", msg) for r in range(128)]
    with pytest.raises(PlacementError) as e:
        evaluate(lay, gathered)
    text = str(e.value)
    assert text.count("no IMEX channel") == 1
    assert "[rank(s) 0-127 on node0000, node0001, node0002, node0003, ... 28 more]" in text
    assert "nvidia-imex" in text and "switch/nvidia_imex" in text


def test_cliques_must_agree_with_configured_racks():
    from llama31_405b.parallel.placement import evaluate
    lay = Layout(tp=4, cp=2, pp=8, dp=2)                  # 2 racks of 16 nodes x 4 GPUs
    good = [Placement(rank=r, host=f"node{r // 4:04d}", rack=f"r{r // 64}", source="config",
                      clique=f"uuid/{r // 64}") for r in range(128)]
    assert evaluate(lay, good) == good
    # the site's rack map says rack r0 = nodes 0-15, but node 15's GPUs are in the other clique
    bad = [Placement(rank=p.rank, host=p.host, rack=p.rack, source="config",
                     clique="uuid/1" if p.host == "node0015" else p.clique) for p in good]
    with pytest.raises(PlacementError, match="NVLink clique: .* span racks") as e:
        evaluate(lay, bad)
    assert "node0015" in str(e.value)
