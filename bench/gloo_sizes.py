"""How gloo's all-reduce time grows with the message on the 2-core development machine: two ranks,
a core each (no pinning: the product pins nothing where every rank has a core), the product's
gloo settings (`gloo_workers`; one intra-op thread), an all-reduce of each size back to back.

Why: the planner's transport prices a collective as a latency plus bytes over a bandwidth, both
fitted where two layouts give two message sizes (the 2-rank proof: TP2's all-reduces of one
microbatch's activations, 128 KB at one microbatch of the tiny model, and DP2's gradient buffer,
about 7 MB). The TP collectives of larger microbatches (256 KB at 2, 512 KB at 4) took 1.25-1.53x
their prediction on 2 ranks (docs/planner.md, "Where it stands"): this measures the curve between
the two sizes without a model, against the line through its two ends that such a fit draws.

With `--dtype bf16` (after the eleventh set, 2026-12-07) the messages are BF16 (twice the elements
for the same bytes): the GB200 settings' TP all-reduces and gradient buckets are BF16, and their
TP at 2 ranks with microbatches of 4 took 1.82x the prediction that FP32 fit layouts drew.

Prints per size the time of one all-reduce (median over `--ops`, the slower rank's, each round),
the line through the `--low` and `--high` sizes (latency + bytes / bandwidth) and measured / line:
the comparison is the result, not any figure alone. Never part of `make test`.

    .venv/bin/python bench/gloo_sizes.py [--ops 40] [--rounds 2] [--low 131072] [--high 7340032]
                                         [--dtype fp32|bf16]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gloo_dp_groups import _port  # noqa: E402  (a free port for torchrun's rendezvous)
SIZES = [32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 7 << 20]
"""Message sizes in bytes (FP32 elements x 4): the tiny model's TP all-reduce at microbatches of
1, 2 and 4 is 128, 256 and 512 KB; its gradient buffer about 7 MB."""


def worker(ops: int, dtype: str) -> None:
    import torch
    import torch.distributed as dist

    from llama31_405b import gloo_workers
    gloo_workers.apply()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for size in SIZES:
        buf = (torch.ones(size // 4) if dtype == "fp32"
               else torch.ones(size // 2, dtype=torch.bfloat16))
        dist.all_reduce(buf)                 # one untimed first (allocations, caches)
        times = []
        for _ in range(ops):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            times.append(time.perf_counter() - t0)
        print(f"size {size} rank {rank} ms {statistics.median(times) * 1e3:.4f}", flush=True)
    dist.destroy_process_group()


def run(ops: int, dtype: str = "fp32") -> dict[int, float]:
    """Per size the slower rank's median all-reduce, ms."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        f"--master_port={_port()}", "--master_addr=127.0.0.1", __file__,
                        "--worker", "--ops", str(ops), "--dtype", dtype],
                       env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"the ranks failed:\n{r.stderr[-3000:]}")
    out: dict[int, float] = {}
    for line in r.stdout.splitlines():
        if line.startswith("size "):
            f = line.split()
            out[int(f[1])] = max(out.get(int(f[1]), 0.0), float(f[-1]))
    return out


def line_through(times: dict[int, float], low: int, high: int) -> tuple[float, float]:
    """(latency ms, ms per byte) of the line through the times at sizes `low` and `high`."""
    per_byte = (times[high] - times[low]) / (high - low)
    return times[low] - per_byte * low, per_byte


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=40, help="all-reduces timed per size")
    ap.add_argument("--rounds", type=int, default=2, help="the whole sweep this many times")
    ap.add_argument("--low", type=int, default=128 << 10, help="the line's small end (bytes)")
    ap.add_argument("--high", type=int, default=7 << 20, help="the line's large end (bytes)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                    help="the messages' element type (the same bytes either way)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.ops, a.dtype)
        return 0
    if a.low not in SIZES or a.high not in SIZES or a.low >= a.high:
        sys.exit(f"--low and --high must be two of the sizes {SIZES}, the low one first")
    rounds = [run(a.ops, a.dtype) for _ in range(a.rounds)]
    med = {s: statistics.median(r[s] for r in rounds) for s in SIZES}
    lat, per_byte = line_through(med, a.low, a.high)
    print(f"{a.dtype} messages; line through {a.low} and {a.high} bytes: {lat:.3f} ms + "
          f"{per_byte * 1e6:.3f} ms/MB")
    line = {s: lat + per_byte * s for s in SIZES}
    rows = [f"{'bytes':>9s} {'ms (each round)':>20s} {'line ms':>8s} {'measured / line':>16s}"]
    rows += [f"{s:9d} {', '.join(f'{r[s]:7.3f}' for r in rounds):>20s} "
             f"{line[s]:8.3f} {med[s] / line[s]:16.2f}" for s in SIZES]
    rows.append(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
