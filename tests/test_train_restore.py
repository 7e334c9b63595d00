"""The in-place restore after the warm-up (train.warmup.RestorePoint), piece by piece: weights,
Adam state and step counters, parameter groups, RNG streams (graph-safe generators in place),
Transformer Engine recipe statistics. The end-to-end check is tests/test_train_warmup.py."""
import pytest
import torch

from llama31_405b.train.warmup import RestoreError, RestorePoint


class _Chunk(torch.nn.Module):
    """A model chunk as the loop holds it (DDP): parameters and a gradient buffer to zero."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.zeroed = 0

    def zero_grad_buffer(self):
        self.zeroed += 1


def _step(chunk, opt, x):
    opt.zero_grad()
    chunk.lin(x).square().sum().backward()
    opt.step()


def test_weights_adam_state_and_groups_come_back_in_place():
    torch.manual_seed(0)
    chunk = _Chunk()
    opt = torch.optim.AdamW(chunk.parameters(), lr=0.1, weight_decay=0.1)
    fresh = {n: p.detach().clone() for n, p in chunk.named_parameters()}
    x = torch.randn(5, 4)
    point = RestorePoint.capture([chunk], opt, gpu=False)
    ptrs = [p.data_ptr() for p in chunk.parameters()]
    for _ in range(3):                                   # the warm-up
        _step(chunk, opt, torch.randn(5, 4))
    opt.param_groups[0]["step"] = 3                      # a group counter (TE FusedAdam style)
    opt.param_groups[0]["lr"] = 7.0
    state_ptrs = [[v.data_ptr() for v in opt.state[p].values()] for p in chunk.parameters()]
    point.restore([chunk], opt)
    assert chunk.zeroed == 1
    assert [p.data_ptr() for p in chunk.parameters()] == ptrs
    for n, p in chunk.named_parameters():
        assert torch.equal(p, fresh[n])
    assert [[v.data_ptr() for v in opt.state[p].values()] for p in chunk.parameters()] == state_ptrs
    for p in chunk.parameters():           # zero moments, step 0: Adam's state before step 1
        assert all(float(v.abs().sum()) == 0 for v in opt.state[p].values())
    assert "step" not in opt.param_groups[0] and opt.param_groups[0]["lr"] == 0.1
    # the next step equals the first step of an optimizer that never ran
    twin = _Chunk()
    twin.load_state_dict({k: v.clone() for k, v in fresh.items()})
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=0.1, weight_decay=0.1)
    _step(chunk, opt, x)
    _step(twin, twin_opt, x)
    for (n, p), q in zip(chunk.named_parameters(), twin.parameters()):
        assert torch.equal(p, q), n


class _QuantizedParam(torch.nn.Parameter):
    """Stands for a Transformer Engine quantized parameter (precision.te_recipe.is_te_quantized
    goes by the class's module)."""

    def dequantize(self):
        return self


_QuantizedParam.__module__ = "transformer_engine.pytorch.tensor.float8_tensor"


def test_quantized_parameters_come_back_from_their_checkpoint_values_else_are_refused():
    chunk = _Chunk()
    chunk.q = _QuantizedParam(torch.full((2,), 3.0))
    opt = torch.optim.SGD([chunk.lin.weight, chunk.lin.bias], lr=0.1)
    with pytest.raises(RestoreError, match="quantized"):
        RestorePoint.capture([chunk], opt, gpu=False)
    point = RestorePoint.capture([chunk], opt, gpu=False, quantized={chunk.q: torch.full((2,), 3.0)})
    with torch.no_grad():
        chunk.q.fill_(-1.0)
    point.restore([chunk], opt)
    assert torch.equal(chunk.q.detach(), torch.full((2,), 3.0))


def test_optimizer_state_without_a_known_initial_value_is_refused():
    chunk = _Chunk()
    opt = torch.optim.AdamW(chunk.parameters(), lr=0.1)
    point = RestorePoint.capture([chunk], opt, gpu=False)
    _step(chunk, opt, torch.randn(2, 4))
    opt.state[next(chunk.parameters())]["mystery"] = torch.ones(1)
    with pytest.raises(RestoreError, match="mystery"):
        point.restore([chunk], opt)


def test_rng_streams_and_graph_safe_generators_are_restored_in_place():
    import random

    import numpy as np
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
    tracker = get_cuda_rng_tracker()
    gen = torch.Generator().manual_seed(5)       # a graph-safe state is a Generator object
    tracker.states_["graph-safe"] = gen
    try:
        chunk = _Chunk()
        opt = torch.optim.SGD(chunk.parameters(), lr=0.1)
        point = RestorePoint.capture([chunk], opt, gpu=False)
        want = (random.random(), np.random.rand(), torch.rand(1),
                torch.rand(1, generator=gen))
        point.restore([chunk], opt)
        assert tracker.get_states()["graph-safe"] is gen            # the same object
        got = (random.random(), np.random.rand(), torch.rand(1), torch.rand(1, generator=gen))
        assert got[:2] == want[:2] and torch.equal(got[2], want[2])
        assert torch.equal(got[3], want[3])
    finally:
        tracker.states_.pop("graph-safe", None)


class _DelayedState:
    """Like TE's DelayedScalingRecipeState: statistics in persistent buffers."""
    _persistent_state_buffers = ("scale", "amax_history")

    def __init__(self):
        self.scale = torch.ones(3)
        self.amax_history = torch.zeros(4, 3)


class _NVFP4State:
    """Like TE's NVFP4BlockScalingRecipeState: no statistics."""


class _TEModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))
        self.fp8_meta = {}


def test_te_recipe_statistics_are_restored_or_reset_in_place():
    chunk = _Chunk()
    chunk.a, chunk.b = _TEModule(), _TEModule()
    chunk.a.fp8_meta["scaling_fwd"] = _DelayedState()          # exists before the warm-up
    chunk.a.fp8_meta["scaling_fwd"].scale.fill_(2.0)
    chunk.b.fp8_meta["scaling_fwd"] = _NVFP4State()
    opt = torch.optim.SGD(chunk.parameters(), lr=0.1)
    point = RestorePoint.capture([chunk], opt, gpu=False)
    a_fwd = chunk.a.fp8_meta["scaling_fwd"]
    a_fwd.scale.fill_(9.0)
    a_fwd.amax_history.fill_(3.0)
    chunk.a.fp8_meta["scaling_bwd"] = _DelayedState()          # created by the warm-up
    chunk.a.fp8_meta["scaling_bwd"].scale.fill_(5.0)
    chunk.a.fp8_meta["scaling_bwd"].amax_history.fill_(1.0)
    bwd_scale = chunk.a.fp8_meta["scaling_bwd"].scale
    point.restore([chunk], opt)
    assert torch.equal(a_fwd.scale, torch.full((3,), 2.0))
    assert float(a_fwd.amax_history.abs().sum()) == 0
    assert chunk.a.fp8_meta["scaling_bwd"].scale is bwd_scale
    assert torch.equal(bwd_scale, torch.ones(3))
    assert float(chunk.a.fp8_meta["scaling_bwd"].amax_history.abs().sum()) == 0


class _UnknownState:
    """A recipe state whose statistics buffer has no initial value the restore knows."""
    _persistent_state_buffers = ("amax_history", "mystery_stat")

    def __init__(self):
        self.amax_history = torch.zeros(4, 3)
        self.mystery_stat = torch.ones(3)


def test_a_te_recipe_buffer_without_a_known_initial_value_is_refused():
    chunk = _Chunk()
    chunk.a = _TEModule()
    opt = torch.optim.SGD(chunk.parameters(), lr=0.1)
    point = RestorePoint.capture([chunk], opt, gpu=False)
    chunk.a.fp8_meta["scaling_bwd"] = _UnknownState()          # created by the warm-up
    with pytest.raises(RestoreError, match="recipe buffer 'mystery_stat'"):
        point.restore([chunk], opt)


def test_tensor_group_entries_and_number_state_come_back_in_place():
    """A group entry held as a tensor (TE FusedAdam's lr with capturable=True) is copied back
    into the same tensor; a zero-initialised state entry the warm-up created as a number is
    reset to a zero of its type."""
    chunk = _Chunk()
    lr = torch.tensor(0.1)
    opt = torch.optim.AdamW(chunk.parameters(), lr=lr)
    point = RestorePoint.capture([chunk], opt, gpu=False)
    _step(chunk, opt, torch.randn(2, 4))
    opt.param_groups[0]["lr"].fill_(0.5)
    p = next(chunk.parameters())
    opt.state[p]["step"] = 7                      # as an optimizer keeping a Python counter
    point.restore([chunk], opt)
    assert opt.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.1)
    assert opt.state[p]["step"] == 0 and type(opt.state[p]["step"]) is int


def test_the_cuda_rng_state_is_restored_on_a_gpu(monkeypatch):
    """A GPU run's snapshot holds the CUDA generator's state: restored with the others (the
    CUDA calls stood in for: no device here)."""
    from llama31_405b.train import warmup
    saved = warmup._capture_rng(False)
    saved["cuda"] = torch.tensor([1, 2, 3], dtype=torch.uint8)
    got = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s: got.append(s))
    want = torch.rand(1)
    warmup._restore_rng(saved)
    assert got == [saved["cuda"]] and torch.equal(torch.rand(1), want)
