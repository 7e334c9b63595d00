"""Blocks docs/coverage.md lists as GPU or CUDA only that CPU code reaches, each with what it
does asserted:

- the CPU stand-ins themselves (cpu_compat: a GPU decision leaves torch alone, the stream
  stand-in's answers, the CUDA-to-CPU redirect of `.to("cuda", ...)` and pinned memory, the
  redirect left on under another function mode; rehearse.meta_compat: refused where CUDA is
  visible, `.cuda()` and `.to("cuda", ...)` sent to the meta device);
- first contact's logic around its GPU runs: a slice estimate on a GPU without a quantized
  recipe, the replay-versus-eager verdicts when a replay is not bitwise eager (the run's graph
  replay and Megatron's schedule stood in for: CUDA graphs do not run here), the build check's
  Transformer Engine guards (the tiny slice built on the CPU), the relative error of the
  NVFP4-emulation figures, the full-iteration graphs' capture record."""
from __future__ import annotations

import types

import pytest
import torch
from torch.overrides import TorchFunctionMode

from conftest import REPO

TINY = REPO / "configs" / "tiny_cpu.toml"
GB200 = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"


class _Seen(TorchFunctionMode):
    """A torch-function mode that records what it sees."""

    def __init__(self):
        super().__init__()
        self.funcs: list = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.funcs.append(func)
        return func(*args, **(kwargs or {}))


# -- cpu_compat ---------------------------------------------------------------------------------
def test_a_gpu_decision_leaves_torch_unpatched(monkeypatch):
    from llama31_405b import cpu_compat
    from llama31_405b.systems import device
    monkeypatch.setattr(cpu_compat, "_applied", False)
    before = (torch.cuda.current_device, torch.cuda.synchronize, torch.cuda.Stream)
    gpu = device.Device(gpu=True, system="h200-sxm", cuda_visible=True)
    assert cpu_compat.apply(gpu) is False
    monkeypatch.setattr(device, "cuda_visible", lambda: True)
    assert cpu_compat.apply() is False                 # no decision: a visible GPU is used
    assert (torch.cuda.current_device, torch.cuda.synchronize, torch.cuda.Stream) == before
    assert cpu_compat._applied is False


def test_the_stream_stand_in_is_always_done():
    from llama31_405b.cpu_compat import _NoStream
    s = _NoStream(priority=-1)
    event = s.record_event()
    assert isinstance(event, _NoStream) and event.query() and s.query()
    assert s.record() is None and s.synchronize() is None and s.wait_event(event) is None


def test_the_redirect_sends_cuda_placements_and_pinning_to_the_cpu():
    from llama31_405b.cpu_compat import _CudaToCpu
    x = torch.arange(3, dtype=torch.float32)
    with _CudaToCpu():
        y = x.to("cuda:0", torch.float64)             # device positional, then dtype
        pinned = torch.empty(4, pin_memory=True)
        z = torch.zeros(2, device="cuda", pin_memory=True)
    assert y.device.type == "cpu" and y.dtype == torch.float64 and torch.equal(y, x.double())
    assert pinned.device.type == "cpu" and not pinned.is_pinned() and pinned.shape == (4,)
    assert z.device.type == "cpu" and torch.equal(z, torch.zeros(2))


def test_the_redirect_stays_on_under_another_mode(monkeypatch):
    """without_cuda_redirect pops the redirect only when it is on top of the mode stack; under
    another mode the function runs as is, through both."""
    from llama31_405b import cpu_compat
    redirect, other = _Seen(), _Seen()
    monkeypatch.setattr(cpu_compat, "_mode", redirect)
    fn = cpu_compat.without_cuda_redirect(lambda t: t.add(1))
    x = torch.zeros(1)
    with redirect:
        alone = fn(x)
    assert torch.Tensor.add not in redirect.funcs      # on top: popped while fn ran
    with redirect:
        with other:
            under = fn(x)
    assert torch.Tensor.add in other.funcs and torch.Tensor.add in redirect.funcs
    assert torch.equal(alone, torch.ones(1)) and torch.equal(under, torch.ones(1))


# -- rehearse/meta_compat -----------------------------------------------------------------------
def test_the_meta_patches_are_refused_where_cuda_is_visible(monkeypatch):
    from llama31_405b.rehearse import meta_compat
    monkeypatch.setattr(meta_compat, "_applied", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA_VISIBLE_DEVICES="):
        meta_compat.apply()
    assert meta_compat._applied is False


def test_cuda_placements_go_to_the_meta_device():
    from llama31_405b.rehearse.meta_compat import _CudaToMeta
    t = torch.zeros(2, 3, device="meta")
    with _CudaToMeta():
        same = t.cuda()
        half = t.to("cuda", torch.float16)
    assert same is t
    assert half.is_meta and half.dtype == torch.float16 and half.shape == (2, 3)


# -- first contact ------------------------------------------------------------------------------
def test_no_slice_estimate_on_a_gpu_without_a_quantized_recipe():
    from llama31_405b.config import load_config
    from llama31_405b.first_contact.fit import slice_estimate
    cfg = load_config(GB200, validate=False)
    kw = dict(te=True, cpu=False, layers=1, seq_length=None, steps=3, system="h200-sxm")
    assert slice_estimate(cfg, cap=(8, 0), **kw) is None               # an A100
    assert slice_estimate(cfg, cap=(9, 0), **kw) is not None           # an H200: FP8


def test_the_relative_error_of_the_emulation_figures():
    from llama31_405b.first_contact.layer import _rel
    b = torch.tensor([3.0, 4.0], dtype=torch.bfloat16)
    assert _rel(torch.tensor([3.0, 4.0]), b) == 0.0
    assert _rel(torch.tensor([3.0, 9.0]), b) == pytest.approx(1.0)     # |(0, 5)| / |(3, 4)|
    assert _rel(torch.ones(2), torch.zeros(2)) == pytest.approx(2 ** 0.5 / 1e-30)


def test_the_full_iteration_graphs_captured_record(monkeypatch):
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper

    from llama31_405b.train.graphs import FullIterationGraphs
    monkeypatch.setattr(FullCudaGraphWrapper, "cuda_graph",
                        {"training": object(), "validation": None})
    assert FullIterationGraphs.captured() == {"training": True, "validation": False}


class _ReplayRun:
    """What replay_equals_eager reads of a GPU run: a replay (the run's full-iteration graph)
    that leaves `replay` in the gradient buffer and returns `loss`; the evaluation graph's
    loss `eval_loss`."""

    def __init__(self, cfg, *, replay, loss, eval_loss):
        self.cfg, self.replay, self.loss, self.eval_loss = cfg, replay, loss, eval_loss
        self.device = types.SimpleNamespace(gpu=True)
        self.info = types.SimpleNamespace(dp_rank=0, dp_size=1)
        self.last_stage = True
        self.buffer = types.SimpleNamespace(grad_data=torch.zeros(len(replay), dtype=torch.bfloat16))
        self.model = [types.SimpleNamespace(buffers=[self.buffer])]

    def _zero_grads(self):
        self.buffer.grad_data.zero_()

    def _forward_backward(self, mbs):
        self.buffer.grad_data.copy_(torch.tensor(self.replay))
        return torch.tensor([self.loss * 100, 100.0], dtype=torch.float64)

    def _evaluate(self, batch):
        return self.eval_loss


EAGER_GRADS = [1.0, -2.0, 0.5, 4.0]


@pytest.mark.parametrize("replay,loss,status,detail", [
    ([1.0, -2.0, 0.5, 4.0 + 2 ** -5], 2.0, "passed",
     "graph replay vs eager: not bitwise, within tolerance (losses relative 0.00e+00 <= 2^-20, "
     "gradients 7.81e-03 of the largest <= 2^-7)"),
    ([1.0, -2.0, 0.5, 4.5], 2.0, "failed",
     "graph replay vs eager: differ beyond tolerance (train loss 0.00e+00, eval loss "
     "0.00e+00, gradients 1.25e-01; tolerances 2^-20, 2^-20, 2^-7)"),
    (EAGER_GRADS, 2.0 * (1 + 2 ** -18), "failed", "differ beyond tolerance (train loss 3.81e-06"),
], ids=["within", "gradients-beyond", "loss-beyond"])
def test_a_replay_that_is_not_bitwise_eager(monkeypatch, replay, loss, status, detail):
    import llama31_405b.train.evaluation as evaluation
    import llama31_405b.train.step as step
    from llama31_405b.config import load_config
    from llama31_405b.first_contact.checks import replay_equals_eager
    from llama31_405b.first_contact.report import Report
    run = _ReplayRun(load_config(TINY), replay=replay, loss=loss, eval_loss=5.25)

    def eager(model, microbatches, **kw):               # Megatron's schedule, eager: the reference
        assert kw["forward_backward"] is None and kw["gpu"] is True
        run.buffer.grad_data.copy_(torch.tensor(EAGER_GRADS))
        return torch.tensor([200.0, 100.0], dtype=torch.float64)
    monkeypatch.setattr(step, "run_schedule", eager)
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: 5.25)
    rep = Report()
    replay_equals_eager(rep, run)
    c = rep.checks["replay_equals_eager"]
    assert c.status == status and detail in c.detail, c.detail
    assert c.data["grads_bitwise"] is (replay == EAGER_GRADS)
    assert c.data["eval_loss_bitwise"] is True and c.data["graphs"] is True


def _slice_config(tmp_path):
    from llama31_405b.config import load_config
    from llama31_405b.first_contact.slice import slice_config
    return slice_config(load_config(TINY, validate=False), compute="bf16", layers=1,
                        seq_length=64, steps=1, system="cpu", ckpt_dir=str(tmp_path), gaf=False,
                        graphs=False, keep_width=False)


@pytest.mark.parametrize("te", [True, False])
def test_the_build_check_matches_the_layers_with_transformer_engine(monkeypatch, tmp_path, te):
    """With TE the slice must hold TE layers; without it, none (a TE module there is refused by
    name): the build check fails and the rest of the slice is not run."""
    from llama31_405b.first_contact import checks
    from llama31_405b.first_contact.report import PHASES, Report
    from llama31_405b.model import builder
    real = builder.build_model

    def build(*a, **k):
        chunks = real(*a, **k)
        if not te:      # a module of megatron-core's TE extension, as the TE spec builds them
            cls = type("TENorm", (torch.nn.Module,),
                       {"__module__": "megatron.core.extensions.transformer_engine"})
            chunks[0].add_module("te_norm", cls())
        return chunks
    monkeypatch.setattr(builder, "build_model", build)
    rep = Report()
    checks._run_slice(rep, _slice_config(tmp_path), tmp_path, te=te)
    got = {n: (rep.checks[n].status, rep.checks[n].detail) for n in PHASES["slice"]}
    assert got["build"] == ("failed", "RuntimeError: the model has no Transformer Engine layers"
                            if te else "RuntimeError: Transformer Engine layers without "
                            "Transformer Engine: ['TENorm']")
    assert all(got[n] == ("not run", "needs the build check") for n in PHASES["slice"][1:])
    from megatron.core import parallel_state as ps
    assert not ps.model_parallel_is_initialized()            # torn down for the next phase


def test_a_gpu_profile_without_kernels_or_allocator_peaks_fails_the_check(monkeypatch,
                                                                          tmp_path):
    """first contact's `profile` on a GPU: a trace without CUDA kernels and a rank record
    without the allocator's peaks fail the check, naming both beside the figures; the pack is
    written all the same (the captures, which train, stood in for by their figures)."""
    from llama31_405b.first_contact import profiling
    from llama31_405b.first_contact.report import Report
    from llama31_405b.profile import capture
    fig = dict(folder="profile", steps_s=[0.5, 0.5], compute_s=0.4, host_gap_s=0.01,
               kernels=0, cpu_ops=120, eager_step_s=[], baseline_step_s=[0.45], memory=None,
               gpu_trace=False)
    monkeypatch.setattr(profiling, "_capture", lambda rep, run, out, plan, *, graphs: dict(fig))
    monkeypatch.setattr(capture, "install_annotations", lambda run: None)
    def forward_backward(mbs):
        return None
    run = types.SimpleNamespace(
        device=types.SimpleNamespace(gpu=True), _graphs=None,
        cfg=types.SimpleNamespace(checkpoint=types.SimpleNamespace(ckpt_dir=str(tmp_path))),
        _forward_backward=forward_backward)
    rep = Report(path=tmp_path / "slice.json")
    profiling._profile(rep, run)
    c = rep.checks["profile"]
    assert c.status == "failed"
    assert c.detail.startswith(
        "profile: no CUDA kernel in the trace (CUDA activities not recorded), so the GPU trace "
        "parsing did not run; profile: no allocator peaks (torch.cuda.max_memory_allocated/"
        "reserved) in the rank record (eager: 2 profiled steps, 500.0/500.0 ms in the trace")
    assert "memory: none;" in c.detail
    assert c.data["pack"]["path"] == str(tmp_path / "profile_slice.tgz")
    assert (tmp_path / "profile_slice.tgz").is_file()
    assert run.eager is False and run._forward_backward is forward_backward   # put back


def test_emulation_refuses_a_layer_without_megatron_linears():
    """A transformer layer whose linears are not Megatron's Column/RowParallelLinear (what the
    Transformer Engine spec builds) cannot be emulated: refused naming the layer."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from llama31_405b.config import load_config
    from llama31_405b.model.builder import build_model
    from llama31_405b.parallel.setup import setup_parallel, teardown_parallel
    from llama31_405b.precision.emulation import apply_nvfp4_emulation
    cfg = load_config(REPO / "configs" / "tiny_cpu_nvfp4.toml")
    setup_parallel(cfg)
    try:
        chunks = build_model(cfg)            # emulated already: a second call switches nothing
        assert apply_nvfp4_emulation(chunks, cfg) == 4 * cfg.model.num_layers
        layer = next(m for m in chunks[0].modules()
                     if isinstance(m, TransformerLayer) and m.layer_number == 2)
        for name, m in list(layer.named_modules()):
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
                parent, _, leaf = name.rpartition(".")
                setattr(layer.get_submodule(parent), leaf, torch.nn.Identity())
        with pytest.raises(RuntimeError, match="transformer layer 2 has no megatron "
                                               "Column/RowParallelLinear"):
            apply_nvfp4_emulation(chunks, cfg)
    finally:
        teardown_parallel()
