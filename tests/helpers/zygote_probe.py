"""Entries for tests/test_zygote.py (ranks forked by tests/helpers/zygote.py)."""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path


def report(rank: int, out_dir: str) -> None:
    """Writes what the rank sees; all ranks then meet in a gloo all-reduce."""
    import threading

    import torch
    import torch.distributed as dist
    # what the zygote left: imports only (no CPU patches applied, no process group)
    pristine = {"cpu_compat_applied": sys.modules["llama31_405b.cpu_compat"]._applied,
                "process_group": dist.is_initialized()}
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "OMP_NUM_THREADS", "ZYGOTE_PROBE")
    Path(out_dir, f"{rank}.json").write_text(json.dumps({
        "env": {k: os.environ.get(k) for k in keys}, "sum": t.item(), "cwd": os.getcwd(),
        "threads": torch.get_num_threads(), "py_threads": threading.active_count(),
        "pid": os.getpid(), "ppid": os.getppid(), "pristine": pristine}))
    print(f"rank {rank} says hello", flush=True)
    dist.destroy_process_group()


def fail_on_one(rank: int) -> None:
    """Rank 1 raises; the others wait in a collective for it (killed by the harness)."""
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    if rank == 1:
        print("rank 1 about to fail", file=sys.stderr, flush=True)
        raise ValueError("boom on rank 1")
    dist.barrier()


def fail_first_exit_last(rank: int) -> None:
    """Rank 1 fails first but its process ends last (a thread that is not a daemon holds it 3 s,
    as a slow teardown would); rank 2 fails a second later and ends at once."""
    if rank == 1:
        threading.Thread(target=time.sleep, args=(3,)).start()
        raise ValueError("first failure, on rank 1")
    if rank == 2:
        time.sleep(1)
        raise RuntimeError("second failure, on rank 2")


def hang(rank: int) -> None:
    if rank == 0:
        time.sleep(3600)


def main() -> int:
    """Script style: sys.argv and the exit status."""
    print(json.dumps(sys.argv[1:]), flush=True)
    return int(sys.argv[1])
