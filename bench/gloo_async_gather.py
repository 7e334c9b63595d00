"""Does gloo survive several asynchronous all-gathers of one group in flight at once?

torch.distributed alone, no model: 4 gloo ranks under torchrun (PP2 x DP2 groups as
megatron-core builds them); every iteration dispatches the data-parallel group's all-gathers the
way megatron-core 0.19.2's `_ParamAndGradBucketGroup.start_param_sync` does (one
`_coalescing_manager(async_ops=True)` all-gather per bucket group, into views of one parameter
buffer, four for the first chunk and one for the second), runs a little compute, waits for them
and all-reduces a small vector on the world group. With torch 2.13's default of two worker
threads per gloo group (`--threads 2`) runs abort, typically with `malloc(): unaligned tcache
chunk detected` or a segmentation fault in a gloo worker thread; with one worker thread
(`--threads 1`, what llama31_405b.gloo_workers sets on the CPU path) they do not.
Prints one line per run: ok, or the signal that ended it. Results: docs/training.md
("The evaluation's parameter gather on gloo").

    .venv/bin/python bench/gloo_async_gather.py [--threads 2] [--runs 3] [--iters 3000]
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUCKETS = ((32768, 32768, 20000, 130), (40000,))   # elements per bucket, chunk 0 and chunk 1


def worker(threads: int, iters: int) -> int:
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager

    if threads == 1:
        from llama31_405b import gloo_workers
        gloo_workers.apply()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, dp = dist.get_rank(), 2
    pp_rank, dp_rank = divmod(rank, dp)
    groups = [dist.new_group([p * dp + d for d in range(dp)]) for p in range(2)]
    dpg = groups[pp_rank]
    backend = dpg._get_backend(torch.device("cpu"))
    assert backend.options._threads == threads, (backend.options._threads, threads)
    buf = torch.zeros(sum(map(sum, BUCKETS)), dtype=torch.bfloat16)
    chunks, off = [], 0
    for sizes in BUCKETS:
        views = []
        for n in sizes:
            views.append(buf[off:off + n])
            off += n
        chunks.append(views)

    def dispatch(views):
        handles = []
        for v in views:                  # one bucket group: one coalesced all-gather
            with _coalescing_manager(dpg, async_ops=True) as cm:
                shard = v.numel() // dp
                dist.all_gather_into_tensor(v, v[dp_rank * shard:(dp_rank + 1) * shard],
                                            group=dpg, async_op=True)
            handles.append(cm)
        return handles

    x = torch.randn(64, 256)
    for _ in range(iters):
        with torch.no_grad():
            pending = [dispatch(views) for views in chunks]
            for handles in pending:
                x @ x.T
                for h in handles:
                    h.wait()
        dist.all_reduce(torch.zeros(2, dtype=torch.float64))
    dist.destroy_process_group()
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, choices=(1, 2), default=2,
                    help="gloo worker threads per group (torch's default: 2)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=3000, help="iterations per run")
    ap.add_argument("--worker", nargs=2, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        sys.exit(worker(*a.worker))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    failed = 0
    for i in range(a.runs):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4",
                            f"--master_port={port}", "--master_addr=127.0.0.1", __file__,
                            "--worker", str(a.threads), str(a.iters)],
                           cwd=ROOT, env=env, capture_output=True, text=True)
        out = r.stdout + r.stderr
        sig = sorted(set(re.findall(r"exitcode\s*:\s*(-\d+) \(pid: \d+\)\s*\((SIG\w+)\)", out)))
        msg = sorted(set(re.findall(r"(malloc\(\)[^\n]*|free\(\)[^\n]*|corrupted[^\n]*)", out)))
        failed += r.returncode != 0
        what = "ok" if r.returncode == 0 else \
            f"FAILED {[s for _, s in sig if s != 'SIGTERM'] or r.returncode} {msg}"
        print(f"threads {a.threads}, run {i + 1}/{a.runs}, {a.iters} iterations, "
              f"{time.perf_counter() - t0:.0f} s: {what}", flush=True)
    print(f"threads {a.threads}: {failed} of {a.runs} runs failed")


if __name__ == "__main__":
    main()
