"""The initial checkpoint is read once per run, in parallel (checkpoint.format.load_strategy), and
the warm-up's restore puts back the checkpoint's weights bit for bit without reading it again
(train.warmup.RestorePoint): two gloo ranks at DP 2 run train's init (load, DDP with the
distributed optimizer and the overlapped parameter gather, warm-up steps that move the weights,
restore) on a checkpoint written by one process; every byte each rank reads from the
checkpoint's data files is counted (tests/helpers/ckpt_load_worker.py)."""
import json

import pytest

from checkpoint_helpers import write_config
from conftest import REPO
from helpers import zygote

WORKER = REPO / "tests" / "helpers" / "ckpt_load_worker.py"
SHORT = {"run": {"division": "open", "warmup_iters": 2, "max_steps": 4},
         "eval": {"first_step": 2, "interval_steps": 2, "samples": 4}}
# the GB200 path where the CPU has one: BF16 parameters with FP32 master shards of the
# distributed optimizer, overlapped reduce-scatter and parameter gather
GB200_LIKE = {"precision": {"params": "bf16", "grad_reduce_in_fp32": False},
              "optimizer": {"distributed": True},
              "performance": {"overlap_grad_reduce": True, "overlap_param_gather": True}}
ZIP_OVERHEAD = 4096
"""Bytes torch.save adds around each stored chunk (zip headers, pickle), an upper bound."""


def _merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _run(argv, nproc=1, timeout=300):
    # `python WORKER ...` (nproc 1) or `torchrun --nproc_per_node=nproc WORKER ...`, the ranks
    # forked from the preloaded zygote (tests/helpers/zygote.py)
    r = zygote.run_script(WORKER, argv, nproc, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["distributed_bf16", "plain_bf16"])
def test_checkpoint_read_once_in_parallel_and_restored_bit_for_bit(tmp_path, layout):
    config = write_config(tmp_path / "c.toml")
    # plain: Megatron's Float16OptimizerWithFloat16Params (full FP32 copies, no gather)
    precision = GB200_LIKE if layout == "distributed_bf16" else {
        "precision": {"params": "bf16"}, "optimizer": {"distributed": False}}
    common = _merge(SHORT, precision)
    ckpt, saved, got = tmp_path / "ckpt", tmp_path / "save.json", tmp_path / "init.json"
    _run(["save", str(config),
          json.dumps(_merge(common, {"system": {"gpus_per_rack": 1}})), str(ckpt), str(saved)])
    _run(["init", str(config), json.dumps(_merge(common, {"system": {"gpus_per_rack": 2}})),
          str(ckpt), str(got)], nproc=2)
    slice_bytes, largest = json.loads(saved.read_text()).values()
    ranks = json.loads(got.read_text())
    assert len(ranks) == 2
    for r in ranks:
        # the warm-up moved the weights, the restore put the checkpoint's back exactly
        assert r["moved_by_warmup"] > 0, r
        assert r["differ_after_restore"] == [], json.dumps(ranks)
        # its half of the DP x CP group's slice, within one largest tensor
        assert abs(r["bytes_read"] - slice_bytes / 2) <= largest + ZIP_OVERHEAD * r["chunks"], r
    for r in ranks:   # the rehearsal's figures (checkpoint/read_plan.py) are what was read
        pred = r["predicted"]
        assert abs(r["bytes_read"] - pred["after_bytes"]) <= ZIP_OVERHEAD * r["chunks"], r
        assert abs(slice_bytes - pred["slice_bytes"]) <= ZIP_OVERHEAD * ranks[0]["params"], r
    assert all(r["dtypes"] == ["torch.bfloat16"] for r in ranks), ranks
    assert all(r["optimizer"] == (["DistributedOptimizer"] if layout == "distributed_bf16"
                                  else ["Float16OptimizerWithFloat16Params"]) for r in ranks), ranks
    # every stored tensor chunk read by exactly one rank of the group, and nothing else read
    chunks, stored = _stored_tensor_chunks(ckpt)
    assert sum(r["chunks"] for r in ranks) == chunks
    assert sum(r["bytes_read"] for r in ranks) == stored
    assert slice_bytes <= stored <= slice_bytes + ZIP_OVERHEAD * chunks


def _stored_tensor_chunks(ckpt) -> tuple[int, int]:
    """(tensor chunks, their bytes on disk) in the checkpoint's DCP index."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    reader = FileSystemReader(str(ckpt))
    md = reader.read_metadata()
    tensors = [i for i in md.storage_data
               if isinstance(md.state_dict_metadata[i.fqn], TensorStorageMetadata)]
    return len(tensors), sum(md.storage_data[i].length for i in tensors)


def test_stored_chunks_and_the_jobs_reads():
    """The converted checkpoint's chunks behind a shard at TP4 (read_plan.stored_chunk_bytes),
    and the whole job's reads before and with the parallel load (read_plan.totals)."""
    from types import SimpleNamespace

    import torch

    from llama31_405b.checkpoint.read_plan import stored_chunk_bytes, totals

    def shard(shape, frags, prepend=1, mismatch=False):
        return SimpleNamespace(global_shape=shape, axis_fragmentations=frags, dtype=torch.bfloat16,
                               prepend_axis_num=prepend, allow_shape_mismatch=mismatch)
    # a TP4 shard of fc1 (gate/up halves: 2 x TP pieces) costs one whole half of the layer
    assert stored_chunk_bytes(shard((126, 106496, 16384), (126, 8, 1)), vocab_size=0,
                              tp=4) == 53248 * 16384 * 2
    # linear_proj (TP on the input axis) and a norm (not sharded): the whole layer
    assert stored_chunk_bytes(shard((126, 16384, 16384), (126, 1, 4)), vocab_size=0,
                              tp=4) == 16384 * 16384 * 2
    assert stored_chunk_bytes(shard((126, 16384), (126, 1)), vocab_size=0, tp=4) == 16384 * 2
    # the embedding: stored at the true vocab rows, whole
    assert stored_chunk_bytes(shard((128512, 16384), (4, 1), prepend=0, mismatch=True),
                              vocab_size=128256, tp=4) == 128256 * 16384 * 2
    assert totals({0: 10, 1: 12}, world=64, tp=4, pp=2) == {
        "checkpoint_bytes": 22, "before_bytes": 2 * 32 * 22, "after_bytes": 4 * 22}
    assert totals({0: 10}, world=64, tp=4, pp=2) is None       # a stage not played
