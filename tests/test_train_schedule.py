"""LR schedule and evaluation cadence against the rules' formulas."""
import math

import pytest

from llama31_405b.config import load_config
from llama31_405b.train.batches import eval_shard
from llama31_405b.train.schedule import LRSchedule

REPO_CFG = "configs/config_GB200_128x4x144xtp4pp8cp2.toml"


def test_lr_warmup_and_cosine_match_rules():
    s = LRSchedule(lr=8e-5, end_lr=8e-7, warmup_steps=8000, decay_steps=1_192_000, weight_decay=0.1)
    assert s.lr_at(0) == pytest.approx(8e-5 / 8001)           # first update: never LR 0
    assert s.lr_at(3999) == pytest.approx(8e-5 * 4000 / 8001)
    assert s.lr_at(8000) == 8e-5                                # cosine starts at the peak
    mid = 8000 + 1_192_000 // 2
    assert s.lr_at(mid) == pytest.approx((8e-5 + 8e-7) / 2)
    assert s.lr_at(8000 + 1_192_000) == pytest.approx(8e-7)
    assert s.lr_at(10**8) == 8e-7
    lrs = [s.lr_at(k) for k in range(0, 8001, 500)]
    assert lrs == sorted(lrs)


def test_schedule_from_config_uses_derived_values():
    cfg = load_config(REPO_CFG)
    s = LRSchedule.from_config(cfg)
    d = cfg.derived
    assert (s.lr, s.end_lr, s.warmup_steps, s.decay_steps) == (d.lr, d.end_lr, d.warmup_steps,
                                                               d.decay_steps)
    assert d.warmup_steps == math.ceil(8000 * 1152 / d.gbs)


class _Opt:
    def __init__(self):
        self.param_groups = [{"wd_mult": 1.0, "lr_mult": 1.0}, {"wd_mult": 0.0, "lr_mult": 1.0}]


def test_apply_sets_lr_and_weight_decay_per_group():
    s = LRSchedule(lr=1e-3, end_lr=1e-5, warmup_steps=10, decay_steps=90, weight_decay=0.1)
    opt = _Opt()
    lr = s.apply(opt, 10)
    assert lr == 1e-3
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 1e-3]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]   # no decay on norms


@pytest.mark.parametrize("n,dp", [(5760, 112), (5760, 128), (63, 2), (64, 3), (5, 8)])
def test_eval_shards_cover_every_sequence_once(n, dp):
    seen = [i for r in range(dp) for i in eval_shard(n, dp, r)]
    assert seen == list(range(n))
    sizes = [len(eval_shard(n, dp, r)) for r in range(dp)]
    assert max(sizes) - min(sizes) <= 1
