"""The GPU-only blocks of the profile machinery that CPU code reaches (docs/coverage.md lists
them "GPU only"): the device trace's parsing on small kineto-style traces written here (a
copy kernel, an NCCL kernel named only through its host op or through nothing, a trace with no
step window and a step that launched no kernel), and the driver's GPU choices that need no
device: the profile config of per-layer graphs, the CUDA activity of the profiler, the device
name of the rank record. The traces follow tests/test_profile_analysis.py's format (kineto's:
host ops, cuda_runtime launches, kernels on streams, linked by "correlation")."""
from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from llama31_405b.profile.analysis import RankAnalysis
from llama31_405b.profile.trace import parse

MAIN = 1
GEMM = "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT"            # cuBLASLt's name format
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
META = {"rank": 0, "main_tid": MAIN,
        "groups": [{"desc": "DATA_PARALLEL_GROUP_WITH_CP", "role": "DP", "ranks": [0, 2],
                    "tids": []}]}


def ev(name, ts, dur, tid=MAIN, cat="cpu_op", **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": tid,
            "args": args}


def step(ts, dur, k=0):
    return ev(f"profile_step#{k}", ts, dur, cat="user_annotation")


def launch(ts, corr):
    return ev("cudaLaunchKernel", ts, 3, cat="cuda_runtime", correlation=corr)


def device(name, ts, dur, corr, *, cat="kernel", stream=7, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 0, "tid": stream,
            "args": {"correlation": corr, "stream": stream, "device": 0, **args}}


def analyse(events, meta=META):
    return RankAnalysis(parse({"traceEvents": events}), meta)


def approx(x):
    return pytest.approx(x, abs=1e-9)


def test_a_copy_on_the_device_is_other_compute():
    """gpu_memcpy / gpu_memset events count as compute of category "other" (not a GEMM of the
    role their launch ran in)."""
    ra = analyse([step(0, 1000), ev("role:ffn_up", 10, 50, cat="user_annotation"),
                  ev("aten::mm", 10, 40), launch(20, 1), ev("aten::copy_", 60, 10),
                  launch(62, 2),
                  device(GEMM, 100, 200, 1),
                  device("Memcpy HtoD (Pageable -> Device)", 300, 50, 2, cat="gpu_memcpy")])
    st, = ra.steps
    assert ra.gpu and (st.start_us, st.end_us) == (100, 350)
    assert st.compute == {"gemm_ffn_up": approx(200e-6), "other": approx(50e-6)}
    assert st.host_gap_s == 0 and not st.comm


def test_an_nccl_kernel_named_only_through_its_host_op():
    """An NCCL kernel without a group of its own and launched outside any record_param_comms
    takes the group of the host op with the same External id."""
    host = ev("record_param_comms", 400, 5, **{"Collective name": "nccl:all_reduce",
                                               "Process Group Description":
                                                   "DATA_PARALLEL_GROUP_WITH_CP",
                                               "Process Group Ranks": [0, 2],
                                               "External id": 42})
    ra = analyse([step(0, 1000), ev("aten::mm", 10, 40), launch(20, 1), host,
                  device(GEMM, 100, 200, 1),
                  device(ALLREDUCE, 300, 100, 99, stream=20, **{"External id": 42})])
    st, = ra.steps
    dp = st.comm["DATA_PARALLEL_GROUP_WITH_CP"]
    assert (dp.role, dp.ranks, dp.ops) == ("DP", [0, 2], {ALLREDUCE: 1})
    assert (dp.total_s, dp.exposed_s) == (approx(100e-6), approx(100e-6))
    assert not ra.unattributed


def test_an_nccl_kernel_of_no_known_group_is_unattributed():
    ra = analyse([step(0, 1000), ev("aten::mm", 10, 40), launch(20, 1),
                  device(GEMM, 100, 200, 1),
                  device(ALLREDUCE, 300, 100, 99, stream=20, **{"External id": 7})])
    st, = ra.steps
    assert ra.unattributed == {ALLREDUCE: 1}
    assert st.comm["unattributed"].exposed_s == approx(100e-6)
    assert ra.mean()["unattributed"] == {ALLREDUCE: 1}


def test_a_device_trace_without_step_windows_has_no_steps():
    ra = analyse([ev("aten::mm", 10, 40), launch(20, 1), device(GEMM, 100, 200, 1)])
    assert ra.gpu and ra.steps == []
    assert ra.mean()["steps"] == 0


def test_a_last_step_that_launched_no_kernel_has_no_device_window():
    """A step's device span starts at the first kernel at or after its host window; a step
    after the last kernel has none and is left out (the one before ends at its last kernel)."""
    ra = analyse([step(0, 500, 0), ev("aten::mm", 10, 40), launch(20, 1),
                  step(600, 300, 1), ev("aten::add", 610, 5),
                  device(GEMM, 100, 200, 1)])
    st, = ra.steps
    assert (st.start_us, st.end_us) == (100, 300)
    assert st.compute == {"gemm_other": approx(200e-6)}


# -- the driver (profile/capture.py) ----------------------------------------------------------
def test_the_profile_of_a_per_layer_graph_config_runs_eager_layers():
    """cuda_graphs = "layers": the profile run turns the per-layer graphs off (their replays
    bypass the modules the roles are read from) and runs no eager baseline (that is for
    full-iteration graphs)."""
    from llama31_405b.config import load_config
    from llama31_405b.profile.capture import Plan, full_iteration_graphs, profile_config
    from conftest import REPO
    cfg = load_config(REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml",
                      overrides={"performance": {"cuda_graphs": "layers"}})
    plan = Plan(out=REPO / "unused", skip=2, baseline=3, steps=4)
    assert not full_iteration_graphs(cfg)
    out = profile_config(cfg, plan)
    assert out.performance.cuda_graphs == "none" and out.run.max_steps == 2 + 3 + 4
    assert dataclasses.replace(out.performance, cuda_graphs="layers") == cfg.performance
    assert cfg.performance.cuda_graphs == "layers"                 # the input is unchanged


def _gpu_run():
    return types.SimpleNamespace(device=types.SimpleNamespace(gpu=True))


@pytest.mark.filterwarnings("ignore:CUDA is not available, disabling CUDA profiling")
def test_on_a_gpu_the_profiler_records_cuda_activity(tmp_path):
    """torch.profiler with CUDA activities (torch's CPU build accepts them and records the host
    side), the first step's annotation open."""
    from torch.profiler import ProfilerActivity

    from llama31_405b.profile.capture import Plan, ProfileHook
    hook = ProfileHook(Plan(out=tmp_path), rank=1)
    hook.profiled = True
    hook._start(_gpu_run())
    try:
        assert hook.prof is not None and hook.rf is not None
        assert hook.prof.activities == {ProfilerActivity.CPU, ProfilerActivity.CUDA}
    finally:
        hook.rf.__exit__(None, None, None)
        hook.prof.stop()
    names = {e.name for e in hook.prof.events()}
    assert "profile_step#0" in names


def test_on_a_gpu_the_rank_record_names_the_device(monkeypatch):
    from llama31_405b.profile.capture import _device_name
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"NVIDIA H200 #{i}")
    assert _device_name(_gpu_run()) == "cuda:3 NVIDIA H200 #3"
    assert _device_name(types.SimpleNamespace(device=types.SimpleNamespace(gpu=False))) == "cpu"
