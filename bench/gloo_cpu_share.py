"""How much of a gloo collective's time keeps a core busy: the physics behind the planner's
`comm_core_fraction` on a development machine (docs/planner.md, "Ranks sharing cores").

torch.distributed alone, no model: RANKS gloo ranks under torchrun (the product's settings: one
gloo worker thread per group, llama31_405b.gloo_workers; one intra-op thread). Each rank times,
with its process CPU clock (every thread of the process, gloo's included) against the wall clock,
four kinds of communication of the tiny CPU layouts' sizes, each within pairs of ranks (0, 1),
(2, 3), ... as TP2 and PP2 groups are, so that 2 and 4 ranks run the same operations, the second
pair only sharing the cores:

* wait: an all-reduce of 128 KB that the pair's second rank enters 50 ms late (the first rank's
  time is almost all waiting for its peer);
* TP: all-reduces of 128 KB (tiny_cpu's TP all-reduce: sequence 256 x hidden 128 x FP32 x mbs 1);
* DP: reduce-scatters of an 8 MB bucket into 4 MB shards (the tiny model's gradients are about
  7 MB of FP32);
* PP: a send and a receive of 128 KB each way (one microbatch's activations at mbs 1).

Prints one line per rank and kind: wall time per operation and CPU time / wall time. A share
near 0 means the time is waiting (a core is free for another rank); near 1, that the operation
keeps a core busy (copies, sums, system calls). Run it with 2 ranks (a core each) and with 4 (two
per core) on the same machine in the same session; the comparison is the result, not either
figure alone. Never part of `make test`.

    .venv/bin/python bench/gloo_cpu_share.py [--ranks 2] [--ops 200]
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TP_ELEMENTS = 256 * 128          # 128 KB of FP32
DP_ELEMENTS = 1 << 21            # an 8 MB bucket of FP32, reduce-scattered over a pair
PP_ELEMENTS = 256 * 128          # 128 KB of FP32
WAIT_S = 0.05


def _time(fn, n: int) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - w0, time.process_time() - c0


def worker(ops: int) -> None:
    import torch
    import torch.distributed as dist

    from llama31_405b import gloo_workers
    gloo_workers.apply()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pairs = [dist.new_group([p, p + 1]) for p in range(0, world, 2)]   # every rank creates each
    pair = pairs[rank // 2]
    tp, dp, pp = torch.ones(TP_ELEMENTS), torch.ones(DP_ELEMENTS), torch.ones(PP_ELEMENTS)
    shard = torch.empty(DP_ELEMENTS // 2)
    peer = rank ^ 1

    def wait() -> None:
        if rank % 2 == 1:
            time.sleep(WAIT_S)
        dist.all_reduce(tp, group=pair)

    def send_recv() -> None:
        if rank % 2 == 0:
            dist.send(pp, peer)
            dist.recv(pp, peer)
        else:
            dist.recv(pp, peer)
            dist.send(pp, peer)

    kinds = (("wait", wait, max(4, ops // 20)),
             ("TP", lambda: dist.all_reduce(tp, group=pair), ops),
             ("DP", lambda: dist.reduce_scatter_tensor(shard, dp, group=pair), max(4, ops // 10)),
             ("PP", send_recv, ops))
    for name, fn, n in kinds:
        fn()                                  # one untimed operation first (allocations, caches)
        dist.barrier()
        wall, cpu = _time(fn, n)
        print(f"ranks {world} rank {rank} {name:4s}: {wall / n * 1e3:7.3f} ms per operation, "
              f"CPU / wall {cpu / wall:.2f}", flush=True)
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2, help="gloo ranks (even)")
    ap.add_argument("--ops", type=int, default=200, help="operations per kind (TP, PP)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.ops)
        return 0
    if a.ranks < 2 or a.ranks % 2:
        sys.exit("--ranks must be an even number of at least 2 (the PP sends pair the ranks)")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run",
                        f"--nproc_per_node={a.ranks}", f"--master_port={_port()}",
                        "--master_addr=127.0.0.1", __file__, "--worker", "--ops", str(a.ops)],
                       env=env, capture_output=True, text=True)
    lines = sorted(x for x in r.stdout.splitlines() if x.startswith("ranks "))
    print("\n".join(lines))
    if r.returncode:
        print(r.stderr[-3000:], file=sys.stderr)
    print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
