"""Placement on 8-GPU systems, whose NVLink domain is the node: the pure check on synthetic host
tables (TP inside a node accepted, PP across nodes accepted, a TP or node-sized CP group split
over nodes refused), the leaf-switch warning with its expected cost, and the collective on 16
gloo processes as two fake 8-GPU nodes. The same on a real Slurm cluster: test_slurm_nodes.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import zygote
from helpers.ports import free_port

from llama31_405b.config import load_config
from llama31_405b.parallel.distributed import DistEnv
from llama31_405b.parallel.layout import Layout
from llama31_405b.parallel.pipelines import (HopTraffic, format_replica_map, hop_traffic,
                                             switch_spans, switch_warnings)
from llama31_405b.parallel.placement import (ALL_KINDS, Placement, PlacementError, detect_rack,
                                             error_message, evaluate, find_violations,
                                             local_kinds, local_placement)
from llama31_405b.systems import load_system

REPO = Path(__file__).resolve().parents[1]
DGX = load_system("dgx-b200")
UF = Layout(tp=4, cp=2, pp=8, dp=4)               # 32 DGX B200 nodes: one replica per 8 nodes
H100 = Layout(tp=4, cp=4, pp=16, dp=2)            # TP4 x CP4 = 16: CP spans two nodes


def hosts(layout: Layout, node_of_rank, switch_of_node=None) -> list[Placement]:
    out = []
    for r in range(layout.world_size):
        n = node_of_rank(r)
        out.append(Placement(rank=r, host=f"n{n:03d}", rack=f"n{n:03d}", source="host",
                             switch=switch_of_node(n) if switch_of_node else ""))
    return out


def block(r: int) -> int:         # srun's default: 8 consecutive ranks per node
    return r // 8


def check(layout: Layout, ps: list[Placement], system=DGX) -> list[str]:
    return find_violations(layout, ps, local_kinds(system, layout.tp, layout.cp), word="node")


def test_which_groups_must_stay_inside_the_nvlink_domain():
    assert local_kinds(DGX, 4, 2) == ("tp", "cp")       # TP x CP = 8 fits the node
    assert local_kinds(DGX, 4, 4) == ("tp",)            # CP over nodes
    assert local_kinds(load_system("gb200-nvl72"), 4, 2) == ALL_KINDS


def test_tp_inside_a_node_and_pp_across_nodes_is_accepted():
    ps = hosts(UF, block)
    assert check(UF, ps) == []
    # every pipeline spans 8 nodes (by design on 8-GPU systems) ...
    assert all(len({ps[r].host for r in g}) == 8 for g in UF.groups("pp"))
    # ... which the NVL72 rule (every group inside one NVLink domain) would refuse
    assert find_violations(UF, ps)
    text = format_replica_map(UF, ps)
    assert "NVLink domain = node" in text
    assert "DP rank 1: global ranks 64-127, 8 node(s): n008, n009, n010, n011, ... 4 more" in text


def test_cp_may_span_nodes_when_tp_x_cp_exceeds_the_node():
    assert check(H100, hosts(H100, block)) == []
    cp_groups = [g for g in H100.groups("cp")]
    assert {len({r // 8 for r in g}) for g in cp_groups} == {2}


def test_a_tp_group_split_over_two_nodes_is_refused():
    ps = hosts(UF, lambda r: r % 32)                 # srun --distribution=cyclic
    v = check(UF, ps)
    assert v[0].startswith("64 TP group(s), 128 CP group(s) span nodes; 4 of 4 model-parallel")
    assert "TP group ranks 0-3 spans nodes: node n000 (rank 0); node n001 (rank 1); " \
           "node n002 (rank 2); node n003 (rank 3)" in v
    assert not any(line.startswith("PP group") for line in v)   # PP is allowed to span nodes
    msg = error_message(v, node=8)
    assert "TP groups (and CP groups while TP x CP <= 8) must stay inside one node" in msg
    assert "8 tasks per node" in msg and "cyclic" in msg
    with pytest.raises(PlacementError, match="must stay inside one node"):
        evaluate(UF, ps, local_kinds(DGX, 4, 2), node=8)


def test_a_node_sized_cp_group_split_is_refused():
    ps = hosts(UF, lambda r: r // 4)                 # 4 tasks per node: TP whole, CP pairs split
    v = check(UF, ps)
    assert v[0].startswith("128 CP group(s) span nodes")
    assert not any("nodes hold different numbers" in line for line in v)


def test_nodes_with_different_rank_counts_are_refused():
    ps = hosts(UF, lambda r: 0 if r < 4 else (r + 4) // 8)    # 4 ranks on node 0, 12 on the last
    assert any(line.startswith("nodes hold different numbers of ranks") for line in check(UF, ps))


def test_pipelines_over_leaf_switches_warn_with_their_cost():
    cfg = load_config(REPO / "configs" / "config_DGXB200_32x8x144xtp4pp8cp2.toml")
    traffic = hop_traffic(cfg, step_s=20.0)
    # 144 microbatches x 8 chunks per hop and step; a 1/TP shard of 4096 tokens x 16384 BF16
    assert traffic.sends == 1152 and traffic.send_bytes == pytest.approx(4096 * 16384 * 2 / 4)
    assert traffic.seconds == pytest.approx(1152 * 33554432 / 50e9)
    same_leaf = hosts(UF, block, lambda n: f"leaf{n // 16}")   # 16-node leaves: 2 pipelines each
    assert switch_spans(UF, same_leaf) == [] and switch_warnings(UF, same_leaf, traffic) == []
    split = hosts(UF, block, lambda n: f"leaf{n // 12}")       # pipeline 1 = nodes 8-15: 8-11, 12-15
    spans = switch_spans(UF, split)
    assert [(g[0], s) for g, s in spans] == [(64, ["leaf0", "leaf1"])]     # nodes 8-15 only
    (w,) = switch_warnings(UF, split, traffic)
    assert w.startswith("warning: 1 of 4 model-parallel groups (pipelines) span leaf switches")
    assert "switch leaf0: n008, n009, n010, n011; switch leaf1: n012, n013, n014, n015" in w
    assert "2 of its 8 pipeline hops cross" in w                # 11->12 and the wrap 15->8
    assert "1152 activations of 33.6 MB each way per step (38.65 GB), 773 ms" in w
    assert "3.9% of the predicted 20.00 s step" in w
    assert check(UF, split) == []                                # a warning, never an error
    assert switch_warnings(UF, hosts(UF, block), HopTraffic(1, 1.0, 50.0)) == []  # no topology


def test_an_eight_gpu_rank_is_its_host_with_slurms_leaf_beside_it():
    assert detect_rack("n7", {}, {"SLURM_TOPOLOGY_ADDR": "spine.leaf1.n7"}, node_domain=True) \
        == ("n7", "host")
    cfg = load_config(REPO / "configs/tiny_cpu.toml", overrides=NODE8)
    de = DistEnv(rank=9, world_size=16, local_rank=1, master_addr="n1", master_port=1,
                 hostname="n2", launcher="test")
    env = {"SLURM_TOPOLOGY_ADDR": "spine.rack1.n2", "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.switch.node"}
    assert local_placement(cfg, de, env) == Placement(rank=9, host="n2", rack="n2", source="host",
                                                      switch="rack1")


# --- the collective on 16 gloo processes: two fake 8-GPU nodes ----------------------------------

NODE8 = {"system": {"id": "cpu-node8", "racks": 2, "gpus_per_rack": 8},
         "parallel": {"tp": 2, "pp": 8}, "model": {"num_layers": 8}, "batch": {"micro_batch_size": 1}}
"""The tiny model as TP2-PP8 on 2 nodes of 8 ranks: TP pairs inside a node, the pipeline over both."""


def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from llama31_405b.parallel.distributed import init_process_group
    from llama31_405b.parallel.placement import check_placement
    cfg = load_config(REPO / "configs/tiny_cpu.toml", overrides=NODE8)
    results = []
    for name, node, leaf in (("block", rank // 8, "rack0"), ("leaves", rank // 8, f"rack{rank // 8}"),
                             ("cyclic", rank % 2, "rack0")):
        host = f"n{node + 1}"
        de = DistEnv(rank=rank, world_size=16, local_rank=rank % 8, master_addr="127.0.0.1",
                     master_port=port, hostname=host, launcher="test")
        if name == "block":
            init_process_group(de, backend="gloo", timeout_s=120)
        env = {"SLURM_TOPOLOGY_ADDR": f"spine.{leaf}.{host}",
               "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.switch.node"}
        logged: list[str] = []
        try:
            check_placement(cfg, de, environ=env, log=logged.append)
            results.append(f"{name}: ok\n" + "\n".join(logged))
        except PlacementError as e:
            results.append(f"{name}: PlacementError\n{e}")
    dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.txt").write_text("\n---\n".join(results))


@pytest.mark.slow
def test_check_placement_gloo_two_8_gpu_nodes(tmp_path):
    # the ranks fork from the preloaded zygote (tests/helpers/zygote.py), not fresh interpreters
    zygote.spawn(_worker, (free_port(), str(tmp_path)), 16, check=True)
    texts = [(tmp_path / f"rank{r}.txt").read_text().split("\n---\n") for r in range(16)]
    block, leaves, cyclic = texts[0]
    # TP pairs inside a node, the pipeline over both nodes: accepted; rank 0 logs the map
    assert block.startswith("block: ok\nplacement: 2 node(s), world 16, TP2 CP1 PP8 DP1")
    assert "DP rank 0: global ranks 0-15, 2 node(s): n1, n2; leaf switch(es) rack0" in block
    assert all(t[0] == "block: ok\n" for t in texts[1:])
    # the nodes under two leaf switches: still accepted, with the warning and its cost
    assert leaves.startswith("leaves: ok\n")
    assert "warning: 1 of 1 model-parallel groups (pipelines) span leaf switches" in leaves
    assert "switch rack0: n1; switch rack1: n2" in leaves
    # cyclic ranks: every TP pair is split over the two nodes; every rank raises the same error
    assert len({t[2] for t in texts}) == 1
    assert cyclic.startswith("cyclic: PlacementError\nplacement check failed: TP groups")
    assert "TP group ranks 0-1 spans nodes: node n1 (rank 0); node n2 (rank 1)" in cyclic
