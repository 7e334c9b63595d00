"""One rank of tests/test_index_share.py's two-process test (`zygote.spawn`, torchrun's environment,
gloo): builds the training datasets of a private copy of the tiny data with `build_datasets`, and
records, before the shared copies are unlinked, which process made each and the inode it mapped;
then the arrays against megatron-core's own reader, the reads, and a .bin and an .idx shrunk under
the reads (by rank 0, between two barriers). Writes OUT/rank<RANK>.json."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


def main(rank: int, config: str, data_dir: str, out: str) -> None:
    import numpy as np
    import torch.distributed as dist
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from llama31_405b.config import load_config
    from llama31_405b.data import DataError, binfile, index_share
    from llama31_405b.data.datasets import build_datasets, indexed_datasets

    dist.init_process_group("gloo", init_method="env://")
    cfg = load_config(config)
    cfg.data.data_dir = data_dir
    cfg.data.index_cache_dir = str(Path(out) / "index_cache")
    rec: dict = {"rank": rank}
    real_release = index_share.release

    def release(shared):
        names = sorted(os.path.basename(s.path) for s in shared if s.path)
        rec["shared"] = [{"idx": os.path.basename(s.idx_path), "created": s.created,
                          "ino": s.ino, "name": os.path.basename(s.path or "")} for s in shared]
        rec["present_before"] = [n for n in names if os.path.exists(
            os.path.join(index_share.SHM_DIR, n))]
        real_release(shared)
        rec["names"] = names

    index_share.release = release
    try:
        train, _ = build_datasets(cfg, seed=3, train_samples=16)
    finally:
        index_share.release = real_release
    dist.barrier()   # every process that made a copy has unlinked it
    rec["present_after"] = [n for n in rec["names"] if os.path.exists(
        os.path.join(index_share.SHM_DIR, n))]
    found = indexed_datasets(train)
    rec["equal"], rec["read_only"], rec["source_map_closed"] = [], [], []
    for ix in found:
        eager = IndexedDataset(ix.path_prefix, mmap=True)
        rec["equal"].append(all(np.array_equal(getattr(ix.index, a), getattr(eager.index, a))
                                for a in ("sequence_lengths", "sequence_pointers"))
                            and all(np.array_equal(ix.get(i), eager.get(i))
                                    for i in (0, 1, len(ix) - 1)))
        rec["read_only"].append(not ix.index.sequence_lengths.flags.writeable
                                and not ix.index.sequence_pointers.flags.writeable)
        rec["source_map_closed"].append(not hasattr(ix.index, "bin_buffer_mmap"))
        del eager
    rec["samples"] = [train[i]["tokens"].shape[0] for i in range(4)]
    by_name = {Path(ix.path_prefix).name: ix for ix in found}
    six, seven = by_name["c4-train.en_6_text_document"], by_name["c4-train.en_7_text_document"]
    for key, ix, victim in (("bin_error", seven, f"{seven.path_prefix}.bin"),
                            ("idx_error", six, f"{six.path_prefix}.idx")):
        dist.barrier()
        if rank == 0:
            with open(victim, "r+b") as f:
                f.truncate(64)
        dist.barrier()
        time.sleep(binfile.CHECK_INTERVAL_S)
        try:
            ix.get(len(ix) - 1)
            rec[key] = None
        except DataError as e:
            rec[key] = str(e)
    dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps(rec))
    dist.destroy_process_group()
