"""Whether a gloo send waits for its receiver: the transport fact behind the planner's blocking
exchanges (Plan.blocking_p2p, pipeline.rank_program; docs/planner.md, "Interleaving on gloo").

Two gloo ranks, torch.distributed alone. For each message size (the tiny layouts' activations
and more), rank 0 posts an isend and waits on it while rank 1 sleeps DELAY before posting the
matching irecv. Prints the sender's wait over the delay: about 1 means the send completed only
once the receive was posted (a rendezvous), about 0 that gloo buffered it and the sender went
on. The simulation assumes the first. Never part of `make test`.

    .venv/bin/python bench/gloo_rendezvous.py [--delay 0.5]
"""
from __future__ import annotations

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = (1 << 10, 1 << 14, 1 << 15, 1 << 18, 1 << 22)   # FP32 elements: 4 KB to 16 MB


def _rank(rank: int, port: int, delay: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for n in SIZES:
        t = torch.ones(n)
        dist.barrier()
        if rank == 0:
            t0 = time.perf_counter()
            dist.isend(t, 1).wait()
            waited = time.perf_counter() - t0
            print(f"{n * 4 / 1024:8.0f} KB  sender waited {waited:.3f} s for a receiver "
                  f"{delay:.3f} s late: {waited / delay:.2f}", flush=True)
        else:
            time.sleep(delay)
            dist.irecv(t, 0).wait()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay", type=float, default=0.5, help="the receiver's lateness, seconds")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"torch {torch.__version__}, gloo, 2 ranks on one machine")
    mp.spawn(_rank, args=(port, args.delay), nprocs=2)


if __name__ == "__main__":
    main()
