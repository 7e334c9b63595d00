"""The initial checkpoint read once, in parallel (tests/test_train_ckpt_load.py).

usage: python tests/helpers/ckpt_load_worker.py save CONFIG OVERRIDES_JSON CKPT OUT_JSON
       torchrun ... tests/helpers/ckpt_load_worker.py init CONFIG OVERRIDES_JSON CKPT OUT_JSON
       torchrun ... tests/helpers/ckpt_load_worker.py chunks CONFIG HF_DIR CKPTS_JSON OUT_JSON
(tests/test_train_ckpt_load.py starts save and init, tests/test_checkpoint_convert.py chunks,
through tests/helpers/zygote.py)

save: one process builds the model (seeded), writes it with checkpoint.format.save and keeps
      the values it wrote (OUT_JSON's sibling `reference.pt`).
init: every rank runs train's init (Run._init: load, DDP, optimizer, warm-up on synthetic tokens,
      in-place restore) without datasets, counting the bytes it reads from the checkpoint's data
      files (every chunk torch.distributed.checkpoint's FileSystemReader reads: it reads each
      stored chunk whole, `_StorageInfo.length` bytes); then compares every parameter with the
      values written, bit for bit, and checks that the warm-up had moved them. Rank 0 writes
      OUT_JSON with every rank's figures.
chunks: every rank loads each converted checkpoint of CKPTS_JSON (a list of directories) with
      checkpoint.format.load at the config's layout, counting the chunks it reads, and compares
      every tensor it requested with the Hugging Face weights (checkpoint.mapping.fill, the
      padded vocab rows zero), bit for bit; it also lists the requests that do not find exactly
      one stored chunk of their own box, and the read plan's prediction. Rank 0 writes OUT_JSON.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _reference_path(out: str) -> Path:
    return Path(out).with_name("reference.pt")


def save(cfg, ckpt: str, out: str) -> None:
    import torch
    from llama31_405b.checkpoint import format as ckpt_format
    from llama31_405b.model.builder import build_model
    from llama31_405b.parallel.setup import seed_model_parallel, setup_parallel, teardown_parallel
    from llama31_405b.systems.device import decide
    from llama31_405b import cpu_compat
    device = decide(cfg)
    cpu_compat.apply(device)
    setup_parallel(cfg, None, timeout_s=120, device=device)
    try:
        seed_model_parallel(1234)
        chunks = build_model(cfg, device=device)
        with torch.no_grad():   # norms start at 1: make every tensor distinct
            for p in chunks[0].parameters():
                p.add_(torch.randn_like(p.float()).to(p.dtype) * 0.01)
        ckpt_format.save(chunks, ckpt, cfg)
        torch.save({n: p.detach().clone() for n, p in chunks[0].named_parameters()},
                   _reference_path(out))
        sizes = {n: p.numel() * p.element_size() for n, p in chunks[0].named_parameters()}
    finally:
        teardown_parallel()
    Path(out).write_text(json.dumps({"bytes": sum(sizes.values()),
                                     "largest": max(sizes.values())}))


def _same(param, written) -> bool:
    """Bit for bit, in the run's parameter dtype: the local spec's norms are FP32 when built and
    written, and Megatron's Float16Module casts them to BF16 after the load (as the run does);
    the linear weights are built, written and loaded in BF16."""
    import torch
    return torch.equal(param.detach(), written.to(param.dtype))


def init(cfg, ckpt: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    from llama31_405b.model.builder import unwrap
    from llama31_405b.train import warmup
    from llama31_405b.train.loop import Run

    from torch.distributed.checkpoint.planner import LoadItemType
    counted = {"bytes": 0, "chunks": 0, "object_bytes": 0}
    read_data = FileSystemReader.read_data

    def counting(self, plan, planner):
        for item in plan.items:
            length = self.storage_data[item.storage_index].length
            if item.type == LoadItemType.BYTE_IO:   # megatron-core's common state, per rank
                counted["object_bytes"] += length
            else:
                counted["bytes"] += length
                counted["chunks"] += 1
        return read_data(self, plan, planner)
    FileSystemReader.read_data = counting

    moved = {}
    restore = warmup.RestorePoint.restore

    def watch(self, chunks, optimizer):   # did the warm-up change the weights it restores?
        ref = torch.load(_reference_path(out))
        moved["before_restore"] = sum(not _same(p, ref[n])
                                      for n, p in unwrap(chunks[0]).named_parameters())
        return restore(self, chunks, optimizer)
    warmup.RestorePoint.restore = watch

    run = Run(cfg, seed=cfg.run.seed_base, hooks=[], timeout_s=120, init_checkpoint=ckpt,
              datasets=(None, None))
    run._init()
    ref = torch.load(_reference_path(out))
    params = dict(unwrap(run.model[0]).named_parameters())
    differ = sorted(n for n, p in params.items() if not _same(p, ref[n]))
    from megatron.core import parallel_state as ps
    from llama31_405b.checkpoint.read_plan import rank_read
    predicted = rank_read(run.model, cfg,
                          group_size=ps.get_data_parallel_world_size(with_context_parallel=True),
                          group_rank=ps.get_data_parallel_rank(with_context_parallel=True))
    mine = {"rank": dist.get_rank(), "bytes_read": counted["bytes"], "chunks": counted["chunks"],
            "predicted": predicted.as_dict(),
            "object_bytes": counted["object_bytes"], "moved_by_warmup": moved.get("before_restore"),
            "differ_after_restore": differ, "params": len(params),
            "dtypes": sorted({str(p.dtype) for p in params.values()}),
            "optimizer": sorted({type(o).__name__
                                 for o in warmup.megatron_optimizers(run.optimizer)})}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(everyone))
    from llama31_405b.parallel.setup import teardown_parallel
    teardown_parallel()


def _counting_reads() -> dict:
    """Count what torch DCP's FileSystemReader reads from now on (each stored chunk whole)."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.planner import LoadItemType
    counted = {"bytes": 0, "chunks": 0}
    read_data = FileSystemReader.read_data

    def counting(self, plan, planner):
        for item in plan.items:
            if item.type != LoadItemType.BYTE_IO:
                counted["bytes"] += self.storage_data[item.storage_index].length
                counted["chunks"] += 1
        return read_data(self, plan, planner)
    FileSystemReader.read_data = counting
    return counted


def _requests(chunks) -> list:
    """The ShardedTensors a load of `chunks` requests (as checkpoint.format.load builds them),
    their data the model's parameters."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories

    from llama31_405b.checkpoint.format import drop_extra_states, sharded_state
    sharded = sharded_state(chunks)
    drop_extra_states(sharded)
    apply_factories(sharded)
    return [v for v in nested_values(sharded) if isinstance(v, ShardedTensor)]


def _expected(sh, ref: dict):
    """The Hugging Face values of request `sh`: the box of its global tensor, zero past the
    stored vocab rows."""
    import torch
    p = sh.prepend_axis_num
    full = ref[(sh.key, sh.global_offset[0] if p else None)]
    out = torch.zeros(sh.local_shape, dtype=full.dtype)
    src, dst = [], []
    for o, n, size in zip(sh.global_offset[p:], sh.local_shape, full.shape):
        stop = min(o + n, size)
        src.append(slice(o, stop))
        dst.append(slice(0, max(stop - o, 0)))
    out[tuple(dst)] = full[tuple(src)]
    return out


def _own_chunk(sh, stored) -> bool:
    """Does request `sh` overlap exactly one stored chunk, whose box is its own (clipped to the
    stored shape)?"""
    md = stored[sh.key]
    lo = list(sh.global_offset)
    hi = [o + n for o, n in zip(sh.global_offset, (1,) * sh.prepend_axis_num + sh.local_shape)]
    hi = [min(h, s) for h, s in zip(hi, md.size)]
    hits = [c for c in md.chunks
            if all(co < h and co + cs > o for co, cs, o, h in zip(c.offsets, c.sizes, lo, hi))]
    return (len(hits) == 1 and list(hits[0].offsets) == lo
            and [o + s for o, s in zip(hits[0].offsets, hits[0].sizes)] == hi)


def chunks_mode(cfg, hf_dir: str, ckpts: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemReader

    from llama31_405b.checkpoint import mapping
    from llama31_405b.checkpoint.format import load, stored_chunking
    from llama31_405b.checkpoint.hf_reader import HFCheckpoint
    from llama31_405b.checkpoint.read_plan import rank_read
    from llama31_405b.model.builder import build_model
    from llama31_405b.parallel.setup import seed_model_parallel, setup_parallel, teardown_parallel
    from llama31_405b.systems.device import decide
    from llama31_405b import cpu_compat
    hf = HFCheckpoint(hf_dir)
    ref = {(t.key, t.layer): mapping.fill(t, cfg.model, hf.read, torch.float32)
           for t in mapping.targets(cfg.model)}
    device = decide(cfg)
    cpu_compat.apply(device)
    setup_parallel(cfg, None, timeout_s=120, device=device)
    counted = _counting_reads()
    mine = []
    try:
        for ckpt in json.loads(ckpts):
            seed_model_parallel(4321)
            chunks = build_model(cfg, device=device)
            counted.update(bytes=0, chunks=0)
            info = load(chunks, ckpt, cfg)
            stored = FileSystemReader(ckpt).read_metadata().state_dict_metadata
            requests = _requests(chunks)
            plan = rank_read(chunks, cfg, group_size=1, group_rank=0,
                             chunking=stored_chunking(info, cfg))
            mine.append({
                "ckpt": ckpt, "bytes_read": counted["bytes"], "chunks_read": counted["chunks"],
                "requests": len(requests), "predicted": plan.as_dict(),
                "differ": sorted({f"{sh.key}@{sh.global_offset}" for sh in requests
                                  if not torch.equal(sh.data.float(), _expected(sh, ref))}),
                "not_own_chunk": sorted({f"{sh.key}@{sh.global_offset}" for sh in requests
                                         if not _own_chunk(sh, stored)})})
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        if dist.get_rank() == 0:
            Path(out).write_text(json.dumps(everyone))
    finally:
        teardown_parallel()


def main() -> int:
    mode = sys.argv[1]
    from llama31_405b.config import load_config
    if mode == "chunks":
        cfg_path, hf_dir, ckpts, out = sys.argv[2:6]
        chunks_mode(load_config(cfg_path), hf_dir, ckpts, out)
        return 0
    cfg_path, overrides, ckpt, out = sys.argv[2:6]
    cfg = load_config(cfg_path, overrides=json.loads(overrides))
    {"save": save, "init": init}[mode](cfg, ckpt, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
