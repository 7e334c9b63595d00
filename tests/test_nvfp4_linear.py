"""The NVFP4 linear layer: each GEMM quantizes what TE's recipe table says; TP1 == TP2."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from helpers import zygote
from llama31_405b.precision.linear import (AmaxGroups, NVFP4Recipe, nvfp4_linear,
                                           tp_amax_groups)
from llama31_405b.precision.nvfp4 import fake_quantize

ROOT = Path(__file__).resolve().parents[1]
ALL_ON = NVFP4Recipe(rht=True, stochastic_rounding=True, weights_2d=True)


def _operands(t=64, k=64, n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=g)
    w = torch.randn(n, k, generator=g) * 0.1
    dy = torch.randn(t, n, generator=g) * 1e-3
    return x, w, dy


def _run(x, w, dy, recipe, generator=None, bias=None):
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    y = nvfp4_linear(x, w, bias, recipe=recipe, generator=generator)
    y.backward(dy)
    return y.detach(), x.grad, w.grad


@pytest.mark.parametrize("recipe", [NVFP4Recipe(), ALL_ON, NVFP4Recipe(rht=True),
                                    NVFP4Recipe(stochastic_rounding=True),
                                    NVFP4Recipe(weights_2d=True)], ids=str)
def test_three_gemms_quantize_what_the_recipe_table_says(recipe):
    x, w, dy = _operands()
    g = torch.Generator().manual_seed(11)
    y, dx, dw = _run(x, w, dy, recipe, generator=g)
    sr, rht = recipe.stochastic_rounding, recipe.rht
    wblock = "2d" if recipe.weights_2d else "1d"
    # Fprop: X rowwise 1x16 RN; W 16x16 tiles (2d) or 1x16, RN
    assert torch.equal(y, fake_quantize(x) @ fake_quantize(w, block=wblock).t())
    # Dgrad then Wgrad draw their random bits in this order from the same generator
    g2 = torch.Generator().manual_seed(11)
    dyq = fake_quantize(dy, stochastic=sr, generator=g2)
    wcol = fake_quantize(w, block=wblock, columnwise=True)            # W^T [K, N]
    assert torch.equal(dx, dyq @ wcol.t())
    dyt = fake_quantize(dy, columnwise=True, rht=rht, stochastic=sr, generator=g2)
    xt = fake_quantize(x, columnwise=True, rht=rht)
    assert torch.equal(dw, dyt @ xt.t())
    # and it is an NVFP4-accurate linear
    x_, w_ = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    (x_ @ w_.t()).backward(dy)
    for got, ref in ((y, x @ w.t()), (dx, x_.grad), (dw, w_.grad)):
        assert ((got - ref).norm() / ref.norm()).item() < 0.25


@pytest.mark.parametrize("recipe", [NVFP4Recipe(), ALL_ON], ids=str)
def test_forward_without_autograd_gives_the_same_output(recipe):
    """Under no_grad the layer quantizes only the Fprop operands; the output is the same."""
    x, w, dy = _operands()
    with torch.no_grad():
        y0 = nvfp4_linear(x, w.clone(), recipe=recipe)
    assert torch.equal(y0, _run(x, w, dy, recipe)[0])


def test_knobs_change_the_operands():
    x, w, dy = _operands()
    base = _run(x, w, dy, NVFP4Recipe())
    two_d = _run(x, w, dy, NVFP4Recipe(weights_2d=True))
    rht = _run(x, w, dy, NVFP4Recipe(rht=True))
    assert not torch.equal(base[0], two_d[0])                      # fprop weight blocks
    assert torch.equal(base[0], rht[0]) and torch.equal(base[1], rht[1])   # RHT: Wgrad only
    assert not torch.equal(base[2], rht[2])
    sr1 = _run(x, w, dy, NVFP4Recipe(stochastic_rounding=True), torch.Generator().manual_seed(1))
    assert torch.equal(base[0], sr1[0]) and not torch.equal(base[1], sr1[1])


def test_leading_dims_bias_dtype_and_ragged_tokens():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 7, 32, generator=g)                           # 21 tokens: padded to 32
    w = torch.randn(16, 32, generator=g)
    b = torch.randn(16, generator=g)
    dy = torch.randn(3, 7, 16, generator=g)
    xr, wr, br = (t.clone().requires_grad_(True) for t in (x, w, b))
    y = nvfp4_linear(xr, wr, br)
    y.backward(dy)
    assert y.shape == (3, 7, 16) and torch.equal(br.grad, dy.reshape(-1, 16).sum(0))
    xt = fake_quantize(torch.cat([x.reshape(21, 32), torch.zeros(11, 32)]), columnwise=True)
    dyt = fake_quantize(torch.cat([dy.reshape(21, 16), torch.zeros(11, 16)]), columnwise=True)
    assert torch.equal(wr.grad, dyt @ xt.t())
    xb = x.to(torch.bfloat16).requires_grad_(True)
    yb = nvfp4_linear(xb, w.to(torch.bfloat16))
    yb.float().sum().backward()
    assert yb.dtype == torch.bfloat16 and xb.grad.dtype == torch.bfloat16


def test_main_grad_accumulation():
    x, w, dy = _operands()
    ref = _run(x, w, dy, NVFP4Recipe())[2]
    wp = torch.nn.Parameter(w.clone())
    wp.main_grad = torch.ones_like(w)
    wp.grad_added_to_main_grad = False
    nvfp4_linear(x, wp, accumulate_main_grad=True).backward(dy)
    assert torch.equal(wp.main_grad, 1 + ref) and wp.grad_added_to_main_grad
    assert torch.all(wp.grad == 0)


def test_tp_amax_groups_without_a_group():
    assert tp_amax_groups("column", None, scope="tensor") == AmaxGroups()
    with pytest.raises(ValueError):
        tp_amax_groups("diagonal", None)
    with pytest.raises(ValueError):
        tp_amax_groups("row", None, scope="global")


@pytest.mark.slow
def test_tp1_equals_tp2_and_the_emulation_in_megatron_two_process_gloo(tmp_path):
    """Plain torch.distributed sharding and megatron's Column/RowParallelLinear, TP=2 vs TP=1;
    apply_nvfp4_emulation on a TP=2 megatron GPTModel under DDP (tests/nvfp4_dist_worker.py)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    # its two ranks (main(rank, tmp), as its __main__ spawns them) fork from the preloaded
    # zygote (tests/helpers/zygote.py); the worker's module-level CPU patches stay in the ranks
    r = zygote.spawn(f'{ROOT / "tests" / "nvfp4_dist_worker.py"}:main', (str(tmp_path),), 2,
                     env=env, cwd=ROOT, timeout=240)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "TP2 == TP1: ok" in r.stdout and "emulation: ok" in r.stdout
