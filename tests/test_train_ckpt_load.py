"""The initial checkpoint is read once per run, in parallel (checkpoint.format.load_strategy), and
the warm-up's restore puts back the checkpoint's weights bit for bit without reading it again
(train.warmup.RestorePoint): two gloo ranks at DP 2 run train's init (load, DDP with the
distributed optimizer and the overlapped parameter gather, warm-up steps that move the weights,
restore) on a checkpoint written by one process; every byte each rank reads from the
checkpoint's data files is counted (tests/helpers/ckpt_load_worker.py)."""
import json

import pytest

from llama31_405b.config import load_config

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


def _request(key, shape, offset, local, prepend=1, mismatch=False):
    """A ShardedTensor's fields as read_plan reads them (a BF16 request)."""
    from types import SimpleNamespace

    import torch
    return SimpleNamespace(key=key, global_shape=shape, global_offset=offset, local_shape=local,
                           dtype=torch.bfloat16, prepend_axis_num=prepend,
                           allow_shape_mismatch=mismatch)


def _tp_requests(m, tp: int, rank: int, layers: int) -> list:
    """What TP rank `rank` of a TP `tp` run requests of the 405B model (every layer on one
    stage), as megatron-core 0.19.2 shards it: fc1's gate and up halves apart, the vocab padded."""
    from llama31_405b.checkpoint import mapping
    from llama31_405b.config.derived import padded_vocab
    h, f = m.hidden_size, m.ffn_hidden_size
    qkv = (m.num_attention_heads + 2 * m.num_query_groups) * m.kv_channels
    pv = padded_vocab(m, tp)
    out = [_request(mapping.EMBED, (pv, h), (rank * pv // tp, 0), (pv // tp, h), 0, True),
           _request(mapping.OUTPUT, (pv, h), (rank * pv // tp, 0), (pv // tp, h), 0, True),
           _request(mapping.FINAL_NORM, (h,), (0,), (h,), 0)]
    for i in range(layers):
        out += [_request(mapping.ATTN_NORM, (layers, h), (i, 0), (h,)),
                _request(mapping.MLP_NORM, (layers, h), (i, 0), (h,)),
                _request(mapping.QKV, (layers, qkv, h), (i, rank * qkv // tp, 0), (qkv // tp, h)),
                _request(mapping.PROJ, (layers, h, h), (i, 0, rank * h // tp), (h, h // tp)),
                _request(mapping.FC1, (layers, 2 * f, h), (i, rank * f // tp, 0), (f // tp, h)),
                _request(mapping.FC1, (layers, 2 * f, h), (i, f + rank * f // tp, 0),
                         (f // tp, h)),
                _request(mapping.FC2, (layers, h, f), (i, 0, rank * f // tp), (h, f // tp))]
    return out


def test_stored_chunks_and_the_jobs_reads():
    """The read plan's arithmetic on the real 405B shapes at TP4 (read_plan.stored_bytes, totals):
    a request pays for the stored chunks it overlaps, whole; in whole layers each TP rank's groups
    read the 811.7 GB checkpoint whole (3.25 TB for the job), in the chunks of TP4 the job reads
    it once (0.81 TB: the norms, replicated over TP, four times)."""
    from llama31_405b.checkpoint import mapping
    from llama31_405b.checkpoint.chunking import Chunking
    from llama31_405b.checkpoint.read_plan import stored_bytes, totals
    m = load_config(REPO / "configs" / "config_GB200_2048x4x8xtp4pp8cp2.toml").model
    tp1, tp4 = Chunking.for_model(m, 1), Chunking.for_model(m, 4)
    assert tp4.vocab_chunk_rows == 128512 // 4
    kw = {"vocab_size": m.vocab_size, "tp": 4}
    gate = _request(mapping.FC1, (126, 106496, 16384), (7, 13312, 0), (13312, 16384))
    # a TP4 shard of fc1 costs one whole half of the layer in whole layers, its own piece in TP4's
    assert stored_bytes(gate, tp1, **kw) == 53248 * 16384 * 2
    assert stored_bytes(gate, tp4, **kw) == 13312 * 16384 * 2
    # linear_proj (TP on the input axis): the whole layer, or its own piece
    proj = _request(mapping.PROJ, (126, 16384, 16384), (0, 0, 4096), (16384, 4096))
    assert stored_bytes(proj, tp1, **kw) == 16384 * 16384 * 2
    assert stored_bytes(proj, tp4, **kw) == 16384 * 4096 * 2
    # a norm is replicated: every chunking stores it whole
    norm = _request(mapping.ATTN_NORM, (126, 16384), (3, 0), (16384,))
    assert stored_bytes(norm, tp1, **kw) == stored_bytes(norm, tp4, **kw) == 16384 * 2
    # the embedding of TP rank 3: stored at the true vocab rows, its piece cut there
    emb = _request(mapping.EMBED, (128512, 16384), (3 * 32128, 0), (32128, 16384), 0, True)
    assert stored_bytes(emb, tp1, **kw) == 128256 * 16384 * 2
    assert stored_bytes(emb, tp4, **kw) == (128256 - 3 * 32128) * 16384 * 2
    # the same request moved to another TP rank (what that rank's groups read)
    assert stored_bytes(emb, tp4, tp_rank=0, **kw) == 32128 * 16384 * 2
    up = _request(mapping.FC1, (126, 106496, 16384), (7, 53248 + 3 * 13312, 0), (13312, 16384))
    assert stored_bytes(up, tp4, tp_rank=0, **kw) == stored_bytes(gate, tp4, **kw)
    # the whole job: every TP rank's groups read their slice's chunks once
    requests = _tp_requests(m, 4, 0, m.num_layers)
    job = {c.tp: sum(stored_bytes(s, c, tp_rank=r, **kw) for s in requests for r in range(4))
           for c in (tp1, tp4)}
    checkpoint = sum(stored_bytes(s, tp1, **kw) for s in requests)
    norms = (2 * m.num_layers + 1) * m.hidden_size * 2
    assert round(checkpoint / 1e9, 1) == 811.7
    assert job[1] == 4 * checkpoint and round(job[1] / 1e12, 2) == 3.25
    assert job[4] == checkpoint + 3 * norms and round(job[4] / 1e12, 2) == 0.81
    # totals: the stages' parts summed; None while a stage is missing
    stage = {"chunk_tp": 4, "stage_bytes": 12, "stage_checkpoint_bytes": 10}
    assert totals({0: stage, 1: stage}, world=64, tp=4, pp=2) == {
        "chunk_tp": 4, "checkpoint_bytes": 20, "before_bytes": 2 * 8 * 24, "after_bytes": 24}
    assert totals({0: stage}, world=64, tp=4, pp=2) is None       # a stage not played
