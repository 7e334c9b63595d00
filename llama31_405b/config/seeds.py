"""The seeds of a config's runs: fixed by `run.seed_base`, or drawn from the system's entropy.

MLPerf closed division (training_rules.adoc, "Random numbers"): random number generators must be
seeded from the clock, the system's source of randomness (/dev/urandom), or another generator
seeded that way. A config without `run.seed_base` (the GB200 configs) gets a fresh seed per run from
`os.urandom`; a config that sets it (the tiny CPU configs, tests) runs seed_base + i, reproducibly.
The seed is the one logged with the MLPerf `seed` key.
"""
from __future__ import annotations

import os

SEED_BITS = 31
"""Seeds are drawn in [0, 2**31): numpy's RandomState (Megatron's dataset shuffles) takes 32-bit
seeds, and Megatron's model-parallel tracker adds small offsets to the seed (megatron-core 0.19.2,
tensor_parallel.random.model_parallel_cuda_manual_seed)."""


def entropy_seed() -> int:
    """One seed from the operating system's entropy source (os.urandom, i.e. /dev/urandom)."""
    return int.from_bytes(os.urandom(8), "little") >> (64 - SEED_BITS)


def run_seeds(seed_base: int | None, runs: int) -> tuple[int, ...]:
    """Seeds of `runs` runs: seed_base + i when a base is set, else distinct entropy seeds."""
    if runs < 1:
        raise ValueError(f"number of runs must be >= 1, got {runs}")
    if seed_base is not None:
        return tuple(seed_base + i for i in range(runs))
    seeds: list[int] = []
    while len(seeds) < runs:          # distinct: the package checker refuses a repeated seed
        s = entropy_seed()
        if s not in seeds:
            seeds.append(s)
    return tuple(seeds)


def seed_is_drawn(cfg) -> bool:
    """True when the runs of `cfg` draw their seeds from the system's entropy."""
    return cfg.run.seed_base is None
