"""Ranks pinned to cores where a machine runs more ranks than cores (parallel/cores.py): which
core each rank gets, that the planner's core share follows it, and that a 4-rank job on this
machine's cores really runs pinned."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llama31_405b.parallel.cores import core_for, pin_process
from llama31_405b.parallel.layout import Layout

ROOT = Path(__file__).resolve().parents[1]


def cores_of(layout: Layout, cores=(0, 1), local_world=None, first=0) -> list:
    n = local_world or layout.world_size
    return [core_for(layout, first + r, r, n, cores) for r in range(n)]


def test_a_pipeline_stage_s_peers_share_a_core():
    # Megatron's order tp-cp-ep-pp-dp: PP2 x DP2 puts stage 0 on ranks 0 and 2; in rank order
    # (blocks of neighbours) a core would run both stages of one replica, which take turns
    assert cores_of(Layout(tp=1, cp=1, pp=2, dp=2)) == [0, 1, 0, 1]
    assert cores_of(Layout(tp=2, cp=1, pp=1, dp=2)) == [0, 0, 1, 1]   # a TP group per core
    assert cores_of(Layout(tp=2, cp=1, pp=2, dp=1)) == [0, 0, 1, 1]   # one stage per core
    assert cores_of(Layout(tp=1, cp=1, pp=1, dp=4)) == [0, 0, 1, 1]
    assert cores_of(Layout(tp=1, cp=1, pp=2, dp=4)) == [0, 1, 0, 1, 0, 1, 0, 1]
    # more stages than cores: neighbouring stages share one
    assert cores_of(Layout(tp=1, cp=1, pp=4, dp=1)) == [0, 0, 1, 1]
    # uneven: the first core takes the extra rank; the cores the process may use, in order
    assert cores_of(Layout(tp=1, cp=1, pp=1, dp=3), cores=(5, 3)) == [3, 3, 5]


def test_nothing_is_pinned_where_every_rank_has_a_core():
    assert cores_of(Layout(tp=1, cp=1, pp=1, dp=2)) == [None, None]
    assert cores_of(Layout(tp=2, cp=1, pp=1, dp=2), cores=range(8)) == [None] * 4
    # a machine of a multi-machine job: its own ranks only (the second of two, 2 ranks each)
    assert cores_of(Layout(tp=1, cp=1, pp=2, dp=2), cores=(0,), local_world=2, first=2) == [0, 0]


def test_a_rank_outside_the_layout_or_the_machine_is_refused():
    with pytest.raises(ValueError, match="local rank 4 of 4"):
        core_for(Layout(tp=1, cp=1, pp=1, dp=4), 4, 4, 4, (0, 1))
    with pytest.raises(ValueError, match="not a rank of the 4-rank layout"):
        core_for(Layout(tp=1, cp=1, pp=1, dp=4), 7, 1, 4, (0, 1))


def test_the_planner_s_core_share_is_the_ranks_per_core_where_pinned(tmp_path):
    """systems/cpu.toml pins: a 4-rank layout on its 2 cores stretches by 2 (each core's two
    ranks at half of it), a 2-rank one not at all; unpinned, the demand model's share (under 2)."""
    from dataclasses import replace

    from llama31_405b.config.load import load_config
    from llama31_405b.planner.calibrate.constants import INITIAL
    from llama31_405b.planner.context import Context
    from llama31_405b.planner.step import breakdown, core_share

    def ctx(tp: int, dp: int) -> Context:
        path = tmp_path / f"tp{tp}dp{dp}.toml"
        path.write_text(f'base = "{ROOT / "configs" / "tiny_cpu.toml"}"\n\n[parallel]\ntp = {tp}\n'
                        f"pp = 1\nvp = 1\n\n[batch]\nminibs = 4\nmicro_batch_size = 1\n\n"
                        f"[system]\ngpus_per_rack = {tp * dp}\n")
        return Context.of(load_config(path))
    four, two = ctx(2, 2), ctx(2, 1)
    assert four.system.pin_ranks and four.system.shared_cores == 2 and four.dp == 2
    assert core_share(four, INITIAL) == 2.0 and core_share(two, INITIAL) == 1.0
    assert breakdown(four, INITIAL).core_share == 2.0
    unpinned = replace(four, system=replace(four.system, pin_ranks=False))
    assert core_share(unpinned, INITIAL) < 2.0   # the demand (tests/test_planner_core_share.py)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable cores")
def test_pinning_this_process_pins_every_thread(tmp_path):
    code = (
        "import os, threading, time\n"
        "from llama31_405b.parallel.cores import pin_process\n"
        "from llama31_405b.parallel.layout import Layout\n"
        "ev = threading.Event()\n"
        "t = threading.Thread(target=ev.wait); t.start()\n"
        "n = len(os.sched_getaffinity(0))\n"
        "core = pin_process(Layout(tp=1, cp=1, pp=1, dp=2 * n), 2 * n - 1, 2 * n - 1, 2 * n)\n"
        "tids = os.listdir('/proc/self/task')\n"
        "print(core, sorted({tuple(os.sched_getaffinity(int(t))) for t in tids}), len(tids))\n"
        "ev.set(); t.join()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True).stdout.split(" ", 1)
    last = sorted(os.sched_getaffinity(0))[-1]
    assert out[0] == str(last) and out[1].startswith(f"[({last},)]"), out


def test_only_a_launcher_that_names_the_machine_s_ranks_gets_them_pinned():
    """torchrun says how many ranks run on the machine (LOCAL_WORLD_SIZE); processes started with
    RANK and WORLD_SIZE alone (the tests' zygote, first contact's DP2) and Slurm tasks (srun
    binds them itself) leave it 0, and setup_parallel pins nothing."""
    from llama31_405b.parallel.distributed import dist_env_from_environ
    base = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    assert dist_env_from_environ({**base, "LOCAL_WORLD_SIZE": "4"}).local_world_size == 4
    assert dist_env_from_environ(base).local_world_size == 0
    assert dist_env_from_environ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4",
                                  "SLURM_LOCALID": "1", "MASTER_ADDR": "h"}).local_world_size == 0
