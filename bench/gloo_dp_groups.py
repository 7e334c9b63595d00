"""What the distributed optimizer's DP collectives take on the 2-core development machine, per
layout of the planner's CPU proof: the transfer the planner's transport prices, without a model
and without waiting (docs/planner.md, "Model revision 11").

torch.distributed alone: each layout's ranks, pinned to the cores as the product pins them
(`parallel/cores.py` `core_for`: blocks of a pipeline stage's ranks) with the product's gloo
settings (`gloo_workers`: one worker thread per group; one intra-op thread), run in every DP
group at once what megatron-core's distributed optimizer runs once a step on the tiny CPU
model's FP32 gradient buffer, a reduce-scatter of the buffer then an all-gather of the
parameters (the shard back into the buffer), back to back, `--ops` times. The buffer per rank is
the tiny model's parameters over TP and PP (1,787,008 parameters, `--params`), so that the
layouts move what their runs move:

* DP2: 2 ranks, a core each, the whole buffer;
* TP2 x DP2: 4 ranks, groups (0, 2) and (1, 3) at once, half the buffer (TP halves it), each
  group's two ranks on different cores;
* DP4: 4 ranks, one group over both cores, the whole buffer;
* PP2 x DP2: 4 ranks, groups (0, 2) and (1, 3), half the buffer (a stage's), each group on one
  core.

Prints per layout the time of one reduce-scatter + all-gather (mean over the operations, the
slowest rank's) and its ratio to DP2's, next to the ratio a transport priced by bytes alone
gives ((n - 1) / n of the buffer each way, as the planner's `topology.collective_s`): the
comparison is the result, not any figure alone. With `--scales` (model revision 15) it times the
reduce-scatter and the all-gather apart at each given share of the buffer (1/8 to 2x, say) and
prints per layout the least-squares line of their sum against the bytes each rank sends
((n - 1) / n of its buffer, each way): the time that does not grow with the bytes (ms) and the
time per MB a rank sends. With `--busy K` (after the tenth set, 2026-12-07) each rank launches K
reduce-scatters then K all-gathers of `--bucket` elements asynchronously, as DDP's overlapped
buckets do, once on quiet cores and once while every rank computes (the tiny model's FC1 GEMM in a
loop on a second thread until its collectives are done, on the core the rank is pinned to): it
prints per layout the slowest rank's time per collective each way and their ratio, a collective's
cost in training against on quiet cores. Never part of `make test`.

    .venv/bin/python bench/gloo_dp_groups.py [--ops 20] [--params 1787008] [--scales 0.125,1,2]
                                             [--busy 13 --bucket 70000]
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = {  # name: (tp, pp, dp, the buffer's share of the parameters)
    "DP2": (1, 1, 2, 1.0), "TP2xDP2": (2, 1, 2, 0.5), "DP4": (1, 1, 4, 1.0),
    "PP2xDP2": (1, 2, 2, 0.5)}


def overlapped(group, dp: int, k: int, bucket: int, busy: bool) -> float:
    """ms per collective of K async reduce-scatters then K async all-gathers of `bucket`
    elements, waited for at the end (quiet) or while this rank runs GEMMs until they are done."""
    import torch
    import torch.distributed as dist
    n = max(dp * 64, bucket // (dp * 64) * dp * 64)
    bufs = [torch.ones(n) for _ in range(k)]
    shards = [torch.empty(n // dp) for _ in range(k)]
    x, w = torch.randn(256, 128), torch.randn(128, 704)     # the tiny model's FC1, one sequence
    stop = threading.Event()

    # on a second thread, the main one waiting: polling is_completed() between GEMMs on the main
    # thread never saw the works complete here (the run hung)
    def compute() -> None:
        while not stop.is_set():
            x @ w
    dist.barrier()
    t0 = time.perf_counter()
    th = threading.Thread(target=compute) if busy else None
    if th is not None:
        th.start()
    for launch in (lambda b, s: dist.reduce_scatter_tensor(s, b, group=group, async_op=True),
                   lambda b, s: dist.all_gather_into_tensor(b, s, group=group, async_op=True)):
        for h in [launch(b, sh) for b, sh in zip(bufs, shards)]:
            h.wait()
    t = (time.perf_counter() - t0) / (2 * k) * 1e3
    stop.set()
    if th is not None:
        th.join()
    return t


def worker(name: str, ops: int, params: int, scales: list[float], busy: int = 0,
           bucket: int = 70_000) -> None:
    import torch
    import torch.distributed as dist

    from llama31_405b import gloo_workers
    from llama31_405b.parallel.cores import pin_process
    from llama31_405b.parallel.layout import Layout
    tp, pp, dp, share = LAYOUTS[name]
    layout = Layout(tp=tp, cp=1, pp=pp, dp=dp)
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    core = pin_process(layout, rank, local, int(os.environ["LOCAL_WORLD_SIZE"]))
    gloo_workers.apply()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    groups = {tuple(g): dist.new_group(g) for g in layout.groups("dp")}   # every rank creates each
    group = groups[tuple(layout.group_of("dp", rank))]

    def timed(fn) -> float:
        fn()                                 # one untimed first (allocations, caches)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(ops):
            fn()
        return (time.perf_counter() - t0) / ops * 1e3
    if busy:
        for mode in ("quiet", "busy") * ops:
            print(f"busy {name} {mode} rank {rank} ms "
                  f"{overlapped(group, dp, busy, bucket, mode == 'busy'):.4f}", flush=True)
        dist.destroy_process_group()
        return
    for scale in scales or [1.0]:
        n = int(params * share * scale) // (dp * 64) * dp * 64   # divisible by the group
        buf, shard = torch.ones(n), torch.empty(n // dp)

        def rs() -> None:
            dist.reduce_scatter_tensor(shard, buf, group=group)

        def ag() -> None:
            dist.all_gather_into_tensor(buf, shard, group=group)
        if not scales:
            ms = timed(lambda: (rs(), ag()))
            print(f"layout {name} rank {rank} core {core} ms {ms:.3f}", flush=True)
            continue
        sent = n * 4 * (dp - 1) / dp / 1e6   # MB each rank sends, each way
        print(f"scale {name} {scale} {sent:.6f} rank {rank} rs {timed(rs):.4f} "
              f"ag {timed(ag):.4f}", flush=True)
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(name: str, ops: int, params: int, scales: list[float],
           extra: tuple[str, ...] = ()) -> list[str]:
    """The lines the ranks of layout `name` printed."""
    tp, pp, dp, _ = LAYOUTS[name]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run",
                        f"--nproc_per_node={tp * pp * dp}", f"--master_port={_port()}",
                        "--master_addr=127.0.0.1", __file__, "--worker", name,
                        "--ops", str(ops), "--params", str(params),
                        "--scales", ",".join(map(str, scales)), *extra],
                       env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{name}: the ranks failed:\n{r.stderr[-3000:]}")
    return r.stdout.splitlines()


def run(name: str, ops: int, params: int) -> float:
    """The slowest rank's time of one reduce-scatter + all-gather in layout `name`, ms."""
    return max(float(x.split()[-1]) for x in _ranks(name, ops, params, [])
               if x.startswith("layout "))


def run_scales(name: str, ops: int, params: int, scales: list[float]) -> dict:
    """Per share of the buffer: (MB each rank sends each way, the slowest rank's reduce-scatter
    ms, its all-gather ms)."""
    out: dict[float, tuple[float, float, float]] = {}
    # the ranks print at once: their lines can run into each other, so match records, not lines
    text = "\n".join(_ranks(name, ops, params, scales))
    for m in re.finditer(r"scale \S+ ([0-9.]+) ([0-9.]+) rank \d+ rs ([0-9.]+) ag ([0-9.]*\d)", text):
        sc, mb, rs, ag = (float(x) for x in m.groups())
        old = out.get(sc, (mb, 0.0, 0.0))
        out[sc] = (mb, max(old[1], rs), max(old[2], ag))
    if set(scales) - set(out):
        sys.exit(f"{name}: a share of the buffer is missing from the ranks' output:\n{text[-2000:]}")
    return out


def main_busy(ops: int, rounds: int, k: int, bucket: int) -> None:
    """`--busy`: per layout, the slowest rank's ms per overlapped collective, quiet and while
    the ranks compute (median over the rounds of each round's median over `ops` repeats)."""
    got: dict[str, dict[str, list[float]]] = {n: {"quiet": [], "busy": []} for n in LAYOUTS}
    for _ in range(rounds):
        for name in LAYOUTS:
            text = "\n".join(_ranks(name, ops, 0, [], ("--busy", str(k), "--bucket", str(bucket))))
            per: dict[tuple[str, int], list[float]] = {}
            for m in re.finditer(r"busy \S+ (quiet|busy) rank (\d+) ms ([0-9.]*\d)", text):
                per.setdefault((m[1], int(m[2])), []).append(float(m[3]))
            for mode in ("quiet", "busy"):
                ranks = [statistics.median(v) for (md, _), v in per.items() if md == mode]
                if not ranks:
                    sys.exit(f"{name}: no {mode} figure in the ranks' output:\n{text[-2000:]}")
                got[name][mode].append(max(ranks))
    print(f"{k} reduce-scatters then {k} all-gathers of {bucket:,} FP32 elements, async "
          f"(median of {rounds} rounds of {ops}, the slowest rank)")
    print(f"{'layout':9s} {'quiet ms':>9s} {'computing ms':>13s} {'ratio':>6s}")
    for name, g in got.items():
        q, b = statistics.median(g["quiet"]), statistics.median(g["busy"])
        print(f"{name:9s} {q:9.2f} {b:13.2f} {b / q:6.2f}")


def line_fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of (x, y) points."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def main_scales(ops: int, params: int, rounds: int, scales: list[float]) -> None:
    """`--scales`: each layout's reduce-scatter and all-gather per share of the buffer (median
    over the rounds) and the line of their sum against the MB each rank sends."""
    got: dict[str, list[dict]] = {n: [] for n in LAYOUTS}
    for _ in range(rounds):
        for name in LAYOUTS:
            got[name].append(run_scales(name, ops, params, scales))
    print(f"{'layout':9s} {'share':>6s} {'MB sent':>8s} {'RS ms':>7s} {'AG ms':>7s} "
          f"{'RS+AG':>7s}   (median of {rounds} rounds, the slowest rank)")
    lines = {}
    for name, rounds_of in got.items():
        pts = []
        for sc in scales:
            mb = rounds_of[0][sc][0]
            r = statistics.median(x[sc][1] for x in rounds_of)
            a = statistics.median(x[sc][2] for x in rounds_of)
            pts.append((2 * mb, r + a))     # sent each way: reduce-scatter and all-gather
            print(f"{name:9s} {sc:6.3f} {mb:8.3f} {r:7.2f} {a:7.2f} {r + a:7.2f}")
        lines[name] = line_fit(pts)
    print(f"\n{'layout':9s} {'fixed ms':>9s} {'ms per MB a rank sends':>23s}")
    for name, (fixed, per_mb) in lines.items():
        print(f"{name:9s} {fixed:9.2f} {per_mb:23.3f}")


def bytes_ratio(name: str) -> float:
    """A transport priced by bytes alone: (n - 1) / n of the buffer each way, over DP2's."""
    _, _, dp, share = LAYOUTS[name]
    return share * (dp - 1) / dp / 0.5


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=20, help="reduce-scatter + all-gather pairs timed")
    ap.add_argument("--params", type=int, default=1_787_008,
                    help="parameters of the whole model (the tiny CPU model's)")
    ap.add_argument("--rounds", type=int, default=2, help="each layout this many times, in turn")
    ap.add_argument("--scales", default="",
                    help="shares of the buffer, comma-separated: time the reduce-scatter and "
                         "the all-gather apart at each and fit a line per layout")
    ap.add_argument("--busy", type=int, default=0,
                    help="K: time K overlapped bucket collectives each way, quiet and while "
                         "the ranks compute")
    ap.add_argument("--bucket", type=int, default=70_000,
                    help="elements per bucket with --busy (the tiny GB200 chunk's mean)")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    try:
        scales = [float(x) for x in a.scales.split(",") if x.strip()]
    except ValueError:
        sys.exit(f"--scales {a.scales!r}: give shares of the buffer, e.g. 0.125,0.5,1,2")
    if a.worker:
        worker(a.worker, a.ops, a.params, scales, a.busy, a.bucket)
        return 0
    if a.busy:
        if a.busy < 1 or a.bucket < 1:
            sys.exit("--busy and --bucket: positive counts")
        main_busy(a.ops, a.rounds, a.busy, a.bucket)
        print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
        return 0
    if scales:
        if len(set(scales)) < 2 or min(scales) <= 0:
            sys.exit(f"--scales {a.scales!r}: at least two different positive shares")
        main_scales(a.ops, a.params, a.rounds, scales)
        print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
        return 0
    times: dict[str, list[float]] = {n: [] for n in LAYOUTS}
    for _ in range(a.rounds):
        for name in LAYOUTS:
            times[name].append(run(name, a.ops, a.params))
    base = statistics.median(times["DP2"])
    print(f"{'layout':9s} {'ms (each round)':>22s} {'/ DP2':>6s} {'bytes alone':>12s}")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:9s} {', '.join(f'{t:6.2f}' for t in ts):>22s} {m / base:6.2f} "
              f"{bytes_ratio(name):12.2f}")
    print(f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
