"""Forward+backward time of the emulated NVFP4 linear vs the plain FP32 linear, same shapes/cores.

usage: PYTHONPATH=. python bench/nvfp4_linear.py [--repeats 10] [--threads N] [--microbatches 4]

Shapes: the tiny CPU model's four linears (tokens = micro-batch 2 x sequence 256) and a larger
GEMM. One timed unit is a training step's use of a layer: the weight updated in place (as the
optimizer does), then `--microbatches` forward+backward passes (the tiny run's MiniBS / MBS = 4).
The emulation quantizes a weight once per step and reuses it while its bits are unchanged
(precision.linear.WEIGHT_CACHE, as TE keeps a weight's quantized copy across microbatches), so
a unit pays that once, as in training. Prints per shape and recipe the best-of-N time per pass
and the ratio emulated / plain, and per recipe the geometric means over the tiny shapes (goal
<= 2 for the tiny run's recipe, vanilla) and over all shapes.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from llama31_405b.precision.linear import NVFP4Recipe, nvfp4_linear

# (name, tokens, in_features, out_features)
SHAPES = [
    ("tiny linear_qkv", 512, 128, 256),
    ("tiny linear_proj", 512, 128, 128),
    ("tiny linear_fc1", 512, 128, 704),
    ("tiny linear_fc2", 512, 352, 128),
    ("2048x1024x1024", 2048, 1024, 1024),
    ("4096x2048x2048", 4096, 2048, 2048),
]
RECIPES = {"vanilla (v5.1)": NVFP4Recipe(),
           "rht+sr+2d": NVFP4Recipe(rht=True, stochastic_rounding=True, weights_2d=True)}


def _best_times(fns: list, repeats: int) -> list[float]:
    """Best of `repeats` per function, the functions interleaved in every round (after 2 warm-up
    rounds) so that all of them see the same load from other processes sharing the cores."""
    best = [float("inf")] * len(fns)
    for rnd in range(repeats + 2):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            if rnd >= 2:
                best[i] = min(best[i], time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--quick", action="store_true", help="tiny-model shapes only")
    ap.add_argument("--microbatches", type=int, default=4,
                    help="passes per weight update (default 4: the tiny run's MiniBS / MBS)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, best of {a.repeats} (x8 for small shapes), time per pass")
    print(f"{'shape':<18} {'recipe':<15} {'plain ms':>9} {'nvfp4 ms':>9} {'ratio':>6}")
    g = torch.Generator().manual_seed(0)
    ratios = {r: [] for r in RECIPES}
    tiny = {r: [] for r in RECIPES}
    mb = max(1, a.microbatches)
    for name, t, k, n in SHAPES[:4] if a.quick else SHAPES:
        x = torch.randn(t, k, generator=g).requires_grad_(True)
        w = (torch.randn(n, k, generator=g) * k ** -0.5).requires_grad_(True)
        dy = torch.randn(t, n, generator=g)
        step = torch.randn(n, k, generator=g) * 1e-3

        def update():
            with torch.no_grad():
                step.neg_()
                w.data.add_(step)   # a new weight every unit, through .data as Megatron's optimizer

        def plain():
            update()
            for _ in range(mb):
                x.grad = w.grad = None
                F.linear(x, w).backward(dy)

        def emulated(recipe):
            def run():
                update()
                for _ in range(mb):
                    x.grad = w.grad = None
                    nvfp4_linear(x, w, recipe=recipe).backward(dy)
            return run

        reps = a.repeats * 8 if t * k * n < 1e8 else a.repeats   # small GEMMs: more samples
        base, *emus = _best_times([plain] + [emulated(r) for r in RECIPES.values()], reps)
        base /= mb
        for rname, emu in zip(RECIPES, emus):
            emu /= mb
            ratios[rname].append(emu / base)
            if name.startswith("tiny"):
                tiny[rname].append(emu / base)
            print(f"{name:<18} {rname:<15} {base * 1e3:9.2f} {emu * 1e3:9.2f} {emu / base:6.2f}",
                  flush=True)
    for rname in RECIPES:
        print(f"geometric mean ratio, {rname}: tiny-model shapes "
              f"{statistics.geometric_mean(tiny[rname]):.2f}"
              + (f", all shapes {statistics.geometric_mean(ratios[rname]):.2f}" if not a.quick
                 else ""))
    print(f"goal <= 2 on the tiny shapes (the tiny run's recipe: vanilla); {mb} passes per weight "
          f"update; load average {' '.join(open('/proc/loadavg').read().split()[:3])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
