"""megatron-core 0.19.2's DistributedDataParallel gets the distributed optimizer's parameter
layout from the builder (model.builder._full_param_layouts), as it asks, instead of computing
it itself with a warning on rank 0 of every run; the layout is the one it would have computed:
same buffers, buckets and parameter ranges. configs/tiny_cpu_gb200.toml on 4 gloo ranks (PP2 x
VP2 x DP2: a bucketed first chunk on pipeline rank 0, unbucketed later chunks and ranks)."""
import json

import pytest

from conftest import REPO
from helpers import zygote

pytestmark = pytest.mark.slow
WORKER = REPO / "tests" / "helpers" / "ddp_layout_worker.py"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("layout") / "out.json"
    r = zygote.run_script(WORKER, [REPO / "configs" / "tiny_cpu_gb200.toml",
                                   json.dumps({"run": {"division": "open"}}), out], 4, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out.read_text())


def test_every_chunk_gets_its_layout_and_megatron_warns_no_more(ranks):
    for rank, r in enumerate(ranks):
        assert r["warned"] == 0, f"rank {rank}: megatron-core still auto-computed a layout"
    # the check can fail: megatron-core's own wrap, without a layout, warns on rank 0
    assert ranks[0]["auto_warned"] >= 1


def test_the_layout_is_the_one_megatron_would_compute(ranks):
    for rank, r in enumerate(ranks):
        assert r["same"], f"rank {rank}: buffers, buckets or parameter ranges differ"
    # pipeline rank 0's first chunk is bucketed (several buckets), every other chunk one bucket
    assert [r["buckets"] for r in ranks][0][0] >= 2
    assert all(n == 1 for r in ranks for n in r["buckets"][1:])
    assert all(n == 1 for r in (ranks[1], ranks[3]) for n in r["buckets"])


def test_the_planner_lays_out_the_first_chunks_buckets_as_megatron_did(ranks):
    """Model revision 16: the planner's buckets of pipeline rank 0's first chunk are the ones the
    real model got (embedding and one layer: four, the embedding's the last)."""
    from llama31_405b.config import load_config
    from llama31_405b.planner import comm, costs
    from llama31_405b.planner.context import Context
    from llama31_405b.planner.pipeline import chunk_layers
    ctx = Context.of(load_config(REPO / "configs" / "tiny_cpu_gb200.toml"))
    sizes = costs.chunk_param_sizes(ctx, chunk_layers(ctx, 0, 0), True, False)
    planned = comm.dp_bucket_sizes(sizes, comm.dp_bucket_params(ctx))
    assert list(planned) == ranks[0]["first_chunk"] and len(planned) == 4
