"""The tiny benchmark's initial checkpoint: a short pre-training from random weights on the
separate pre-training shard (cfg.data.pretrain_prefix), saved once as a Megatron distributed
checkpoint under cfg.checkpoint.ckpt_dir/cfg.checkpoint.init and reused by every tiny run.

This mirrors the real benchmark, whose timed run continues pre-training Meta's checkpoint: the
tiny run starts from a model that has already learned the language, on different documents.
The pre-training recipe (not an MLPerf-logged run) is fixed here: AdamW, `PRETRAIN_STEPS` steps,
linear warmup then cosine to 10% of `PRETRAIN_LR`, fixed seed.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from ..config.schema import Config
    from .protocols import Samples

PRETRAIN_STEPS = 120
PRETRAIN_LR = 3e-3
PRETRAIN_WARMUP = 30
PRETRAIN_SEED = 1000


def pretrain_config(cfg: Config) -> Config:
    """The run config with the pre-training shard as its only training data."""
    if not cfg.data.pretrain_prefix:
        raise ValueError(f"{cfg.source}: data.pretrain_prefix is not set; the initial checkpoint "
                         "of a tiny config is pre-trained on that shard")
    data = dataclasses.replace(cfg.data, train_prefixes=[cfg.data.pretrain_prefix],
                               train_weights=[1.0])
    return dataclasses.replace(cfg, data=data)


def init_checkpoint_path(cfg: Config) -> Path:
    return Path(cfg.checkpoint.ckpt_dir) / cfg.checkpoint.init


def make_init_checkpoint(cfg: Config, *, out: str | Path | None = None, steps: int = PRETRAIN_STEPS,
                         lr: float = PRETRAIN_LR, seed: int = PRETRAIN_SEED,
                         datasets: tuple[Samples, Samples] | None = None,
                         stream: TextIO = sys.stderr) -> Path:
    """Pre-train from random weights and save the model. Runs in the current process group
    (world size of cfg); returns the checkpoint path."""
    from ..checkpoint import format as ckpt_format
    from .loop import Run
    from .schedule import LRSchedule
    out = Path(out) if out is not None else init_checkpoint_path(cfg)
    pcfg = pretrain_config(cfg)
    d = pcfg.derived
    if datasets is None:
        from ..data.datasets import build_datasets
        datasets = build_datasets(pcfg, seed=seed, train_samples=steps * d.gbs)
    run = Run(pcfg, seed=seed, hooks=[], init_checkpoint="", datasets=datasets)
    run._init()
    run.schedule = LRSchedule(lr=lr, end_lr=lr / 10, warmup_steps=PRETRAIN_WARMUP,
                              decay_steps=steps - PRETRAIN_WARMUP, weight_decay=d.weight_decay)
    rank0 = run.info.is_rank0
    t0 = time.perf_counter()
    for k in range(steps):
        st = run.train_step()
        if rank0 and (st.step % 25 == 0 or st.step == steps):
            el = time.perf_counter() - t0
            print(f"[pretrain] step {st.step:4d}/{steps} | loss {st.loss:.4f} | lr {st.lr:.2e} | "
                  f"{st.step / el:.1f} steps/s | ETA {(steps - st.step) * el / st.step:.0f} s",
                  file=stream, flush=True)
    run.close()
    value = run.evaluate()
    if rank0:
        print(f"[pretrain] validation log perplexity of the initial checkpoint: {value:.4f}",
              file=stream, flush=True)
    # the weights of the last step on every rank before they are written (run.evaluate has just
    # gathered them; said here too, so the save never depends on it): with the overlapped gather
    # of the distributed optimizer, a DP replica holds only its own shard of the last update
    from .evaluation import sync_params
    sync_params(run.model)
    ckpt_format.save(run.model, out, pcfg,
                     extra={"pretrain_steps": steps, "pretrain_lr": lr, "seed": seed,
                            "valid_log_perplexity": value})
    return out
