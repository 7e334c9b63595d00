"""The MLPerf rules function against the closed llama31_405b formulas (ruleset 6.0.0)."""
import math

import pytest

from llama31_405b.config.rules import LLAMA31_405B, hparams, lr_passes_checker


@pytest.mark.parametrize("gbs", [896, 960, 1008, 1024, 1152, 1280, 2304, 4608])
def test_rules_match_formulas(gbs):
    hp = hparams(LLAMA31_405B, gbs)
    assert hp.lr == gbs * 8e-5 / 1152
    assert hp.lr * 1152 == gbs * 8e-5          # the checker's exact float test
    warmup = math.ceil(8000 * 1152 / gbs)
    assert hp.warmup_steps == warmup
    assert hp.decay_steps == math.ceil(1_200_000 * 1152 / gbs) - warmup
    assert hp.end_lr == 8e-7
    assert (hp.adam_beta1, hp.adam_beta2, hp.adam_eps, hp.weight_decay) == (0.9, 0.95, 1e-5, 0.1)
    assert hp.clip_grad == 1.0
    interval = math.ceil(18432 / gbs)
    assert hp.eval_interval_steps == interval
    assert hp.first_eval_step == (math.floor(0.0026 * gbs + 12) + 1) * interval
    assert hp.eval_samples == 5760 and hp.target == 5.6


def test_published_eval_schedule():
    assert hparams(LLAMA31_405B, 1152).first_eval_step == 240
    assert hparams(LLAMA31_405B, 1024).first_eval_step == 270


def test_uneceiled_warmup_would_fail_at_1008():
    # the mlcommons/training issue 841 case: the ceil matters for the decay steps
    hp = hparams(LLAMA31_405B, 1008)
    unceiled = 8000 * 1152 / 1008
    assert hp.decay_steps != math.ceil(1_200_000 * 1152 / 1008) - int(unceiled)


def test_gbs_whose_lr_cannot_pass_the_checker():
    bad = [g for g in range(8, 4609, 8) if not lr_passes_checker(LLAMA31_405B, g)]
    assert len(bad) == 47                       # README, "How configs work"
    assert {248, 992, 1160, 1760, 3520} <= set(bad)
    assert lr_passes_checker(LLAMA31_405B, 1152)
