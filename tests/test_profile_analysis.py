"""The profile analysis on hand-written Chrome traces whose answers are computed by hand
(docs/profile.md gives the rules): compute overlapped by a collective, two collectives of
different groups at once, a pipeline bubble, a host gap, backward GEMMs attributed by sequence
number; the interval arithmetic; stragglers; the refusal of a profile folder by compliance check
and submission package."""
from __future__ import annotations

import json

import pytest

from llama31_405b.profile import intervals as iv
from llama31_405b.profile import straggler
from llama31_405b.profile.analysis import RankAnalysis
from llama31_405b.profile.trace import parse

MAIN = 1
GROUPS = [
    {"desc": "TENSOR_MODEL_PARALLEL_GROUP", "role": "TP", "ranks": [0, 1], "tids": [10, 11]},
    {"desc": "DATA_PARALLEL_GROUP_WITH_CP", "role": "DP", "ranks": [0, 2], "tids": [20, 21]},
    {"desc": "PIPELINE_MODEL_PARALLEL_GROUP", "role": "PP", "ranks": [0, 4], "tids": [30]},
]
META = {"rank": 0, "main_tid": MAIN, "groups": GROUPS}


def ev(name, ts, dur, tid=MAIN, cat="cpu_op", **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": tid,
            "args": args}


def step(ts, dur, k=0):
    return ev(f"profile_step#{k}", ts, dur, cat="user_annotation")


def analyse(events, meta=META):
    ra = RankAnalysis(parse({"traceEvents": events}), meta)
    assert len(ra.steps) == 1
    return ra, ra.steps[0]


def approx(x):
    return pytest.approx(x, abs=1e-9)


def test_compute_overlapped_by_a_collective():
    # window 0..1000 us; FFN up GEMM 100..400, an add 500..600; a DP all-reduce 300..700
    _, st = analyse([
        step(0, 1000),
        ev("role:ffn_up", 100, 300, cat="user_annotation"),
        ev("aten::mm", 100, 300),
        ev("aten::add", 500, 100),
        ev("gloo:all_reduce", 300, 400, tid=20, cat="user_annotation"),
    ])
    assert st.compute == {"gemm_ffn_up": approx(300e-6), "other": approx(100e-6)}
    dp = st.comm["DATA_PARALLEL_GROUP_WITH_CP"]
    assert dp.role == "DP" and dp.ranks == [0, 2]
    assert dp.total_s == approx(400e-6)
    assert dp.overlapped_s == approx(200e-6)     # 300..400 under the GEMM, 500..600 under the add
    assert dp.exposed_s == approx(200e-6)        # 400..500 and 600..700
    assert st.host_gap_s == approx(400e-6)       # 0..100, 700..1000
    assert sum(st.components().values()) == approx(st.step_s)


def test_two_overlapping_collectives():
    # TP 100..300 and DP 200..500, nothing computing: 200..300 is shared, half each
    _, st = analyse([
        step(0, 600),
        ev("gloo:all_reduce", 100, 200, tid=11, cat="user_annotation"),
        ev("gloo:reduce_scatter", 200, 300, tid=21, cat="user_annotation"),
    ])
    tp, dp = st.comm["TENSOR_MODEL_PARALLEL_GROUP"], st.comm["DATA_PARALLEL_GROUP_WITH_CP"]
    assert (tp.total_s, tp.exposed_s, tp.overlapped_s) == (approx(200e-6), approx(150e-6),
                                                          approx(50e-6))
    assert (dp.total_s, dp.exposed_s, dp.overlapped_s) == (approx(300e-6), approx(250e-6),
                                                          approx(50e-6))
    assert st.exposed_by_role()["TP"] == approx(150e-6)
    assert st.exposed_by_role()["DP"] == approx(250e-6)
    assert st.host_gap_s == approx(200e-6)
    assert st.compute == {}
    assert sum(st.components().values()) == approx(600e-6)


def test_pipeline_bubble_is_exposed_pp_time():
    # the rank waits 0..300 in a receive from the previous stage (gloo's recv event lasts until
    # the data arrived and does not nest with the caller's c10d op), then computes 300..800
    _, st = analyse([
        step(0, 1000),
        ev("c10d::recv_", 0, 5),
        ev("gloo:recv", 2, 298, cat="user_annotation"),
        ev("role:qkv", 300, 500, cat="user_annotation"),
        ev("aten::addmm", 300, 500),
    ])
    pp = st.comm["PIPELINE_MODEL_PARALLEL_GROUP"]
    assert pp.total_s == approx(298e-6) and pp.exposed_s == approx(298e-6)
    assert st.bubble_s == approx(298e-6)
    assert st.compute == {"gemm_qkv": approx(500e-6)}
    assert st.host_gap_s == approx(202e-6)       # 0..2 (the enqueue) and 800..1000
    assert sum(st.components().values()) == approx(1000e-6)


def test_host_gap_between_ops():
    _, st = analyse([step(0, 500), ev("aten::mm", 0, 100), ev("aten::mm", 400, 100)])
    assert st.host_gap_s == approx(300e-6)
    assert st.compute == {"gemm_other": approx(200e-6)}


def test_a_c_kernels_annotated_call_is_compute_and_its_functions_python_host():
    """The emulated NVFP4 quantisation's C kernel runs inside an autograd Function, outside aten:
    its annotated calls (attribution.KERNEL_PREFIX) are compute of the role they ran in, the
    Function's own time host time, and a collective between the calls communication."""
    _, st = analyse([
        step(0, 1000),
        ev("role:ffn_up", 0, 600, cat="user_annotation"),
        ev("NVFP4LinearFunction", 0, 600),
        ev("kernel::nvfp4_block_amax", 50, 100, cat="user_annotation"),
        ev("c10d::allreduce_", 160, 40),
        ev("kernel::nvfp4_rowcol", 250, 150, cat="user_annotation"),
        ev("aten::mm", 450, 100),
        ev("kernel::elsewhere", 700, 100, cat="cpu_op"),   # only annotations name a kernel
    ])
    assert st.compute == {"other": approx(250e-6), "gemm_ffn_up": approx(100e-6)}
    assert st.host_gap_s == approx(1000e-6 - 350e-6)


def test_self_time_and_backward_gemm_by_sequence_number():
    """Compute is aten's self time; a backward GEMM takes the role of its forward op."""
    # forward: FFN down linear (seq 7) with its mm; backward node of seq 7 with two mms
    _, st = analyse([
        step(0, 1000),
        ev("role:ffn_down", 0, 200, cat="user_annotation"),
        ev("aten::linear", 0, 200, **{"Sequence number": 7}),
        ev("aten::t", 0, 20),
        ev("aten::mm", 20, 170),
        ev("autograd::engine::evaluate_function: MmBackward0", 300, 400,
           **{"Sequence number": 7}),
        ev("aten::mm", 320, 150),
        ev("aten::mm", 500, 150),
        ev("autograd::engine::evaluate_function: AddBackward0", 800, 100,
           **{"Sequence number": 99}),
        ev("aten::add", 810, 50),
    ])
    assert st.compute["gemm_ffn_down"] == approx(470e-6)
    # aten::t, the linear's own 10 us, the add; the autograd nodes' own time is host time
    assert st.compute["other"] == approx(20e-6 + 10e-6 + 50e-6)
    assert st.host_gap_s == approx(1000e-6 - 550e-6)


def test_the_node_creator_gives_the_backward_role():
    """Every op records the number the next autograd node will get: an op of the norm before
    the QKV linear carries the number of the QKV Function's node; the Function (last to start)
    gives the role, and the node's own event in the backward is no forward op."""
    _, st = analyse([
        step(0, 1000),
        ev("role:norm", 0, 50, cat="user_annotation"),
        ev("aten::type_as", 0, 10, **{"Sequence number": 9}),
        ev("role:qkv", 60, 100, cat="user_annotation"),
        ev("LinearWithGradAccumulationAndAsyncCommunication", 60, 100, **{"Sequence number": 9}),
        ev("aten::mm", 70, 80),
        ev("autograd::engine::evaluate_function: "
           "LinearWithGradAccumulationAndAsyncCommunicationBackward", 500, 300,
           **{"Sequence number": 9}),
        ev("LinearWithGradAccumulationAndAsyncCommunicationBackward", 500, 300,
           **{"Sequence number": 9}),
        ev("aten::mm", 520, 200),
    ])
    assert st.compute["gemm_qkv"] == approx(280e-6)
    assert "gemm_other" not in st.compute


def test_a_wait_inside_an_autograd_function_is_not_compute():
    """megatron's TP all-reduce runs inside an autograd Function (_ReduceFromModelParallelRegion):
    the Function's event spans the collective's wait, which is exposed TP time, not compute."""
    _, st = analyse([
        step(0, 500),
        ev("_ReduceFromModelParallelRegion", 0, 400),
        ev("c10d::allreduce_", 10, 10),
        ev("gloo:all_reduce", 15, 350, tid=10, cat="user_annotation"),
        ev("aten::add", 400, 100),
    ])
    assert st.compute == {"other": approx(100e-6)}
    assert st.comm["TENSOR_MODEL_PARALLEL_GROUP"].exposed_s == approx(350e-6)
    assert st.host_gap_s == approx(50e-6)


def test_attention_core_and_roles():
    _, st = analyse([
        step(0, 400),
        ev("role:attention_other", 0, 400, cat="user_annotation"),
        ev("aten::mul", 0, 50),                   # RoPE
        ev("role:attention", 50, 300, cat="user_annotation"),
        ev("aten::baddbmm", 50, 100),             # scores: attention core, not a GEMM role
        ev("aten::_softmax", 150, 100),
        ev("aten::bmm", 250, 100),
        ev("profile:optimizer", 360, 40, cat="user_annotation"),
        ev("aten::add_", 360, 40),
    ])
    assert st.compute == {"attention_other": approx(50e-6), "attention": approx(300e-6),
                          "optimizer": approx(40e-6)}


def test_unknown_thread_is_reported_unattributed():
    ra, st = analyse([step(0, 100), ev("gloo:all_gather", 10, 20, tid=99, cat="user_annotation")])
    assert ra.unattributed == {"gloo:all_gather": 1}
    assert st.comm["unattributed"].exposed_s == approx(20e-6)


def test_steps_split_at_their_windows():
    ra = RankAnalysis(parse({"traceEvents": [
        step(0, 100, 0), step(100, 200, 1), ev("aten::mm", 50, 50), ev("aten::mm", 100, 50),
        ev("gloo:all_reduce", 150, 100, tid=10, cat="user_annotation")]}), META)
    a, b = ra.steps
    assert a.compute["gemm_other"] == approx(50e-6) and b.compute["gemm_other"] == approx(50e-6)
    assert b.comm["TENSOR_MODEL_PARALLEL_GROUP"].total_s == approx(100e-6)
    assert "TENSOR_MODEL_PARALLEL_GROUP" not in a.comm
    assert ra.mean()["step_s"] == approx(150e-6)


def test_intervals():
    assert iv.union([(5, 6), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 6)]
    assert iv.measure([(0, 2), (1, 3), (10, 10)]) == 3
    assert iv.intersect([(0, 10)], [(2, 3), (5, 12)]) == [(2, 3), (5, 10)]
    assert iv.subtract([(0, 10)], [(2, 3), (5, 12)]) == [(0, 2), (3, 5)]
    assert iv.clip([(0, 5), (6, 9)], 3, 7) == [(3, 5), (6, 7)]
    parts = iv.partition([((0, 4), "a"), ((2, 6), "b")], 0, 8)
    assert parts == [(0, 2, frozenset("a")), (2, 4, frozenset("ab")), (4, 6, frozenset("b")),
                     (6, 8, frozenset())]


def rank(pp, step_s, compute, host, exposed, steps=None):
    busy = step_s - exposed
    return dict(pp_rank=pp, host="h", device="cpu", step_s=step_s, compute_s=compute,
                host_gap_s=host, exposed_s=exposed,
                steps_busy=steps or [(step_s, busy), (step_s, busy)])


def test_straggler_is_the_rank_the_others_wait_on():
    # stage 0: rank 2 sleeps 0.5 s on the host, its peers wait for it; stage 1 differs by design
    ranks = {0: rank(0, 1.0, 0.3, 0.1, 0.6), 2: rank(0, 1.0, 0.3, 0.6, 0.1),
             4: rank(0, 1.0, 0.31, 0.1, 0.59), 1: rank(1, 1.0, 0.8, 0.1, 0.1),
             3: rank(1, 1.0, 0.8, 0.1, 0.1)}
    found = straggler.find(ranks, threshold=0.1)
    assert [s["rank"] for s in found] == [2]
    assert found[0]["slow_in"].startswith("host")
    # busy = step - exposed; the others of its stage: 0.4 and 0.41
    assert found[0]["excess_s"] == pytest.approx(0.9 - 0.405)
    ranks[2] = rank(0, 1.0, 0.8, 0.1, 0.1)
    assert straggler.find(ranks)[0]["slow_in"] == "compute"
    ranks[2] = rank(0, 1.0, 0.31, 0.1, 0.59)
    assert straggler.find(ranks) == []
    # busier by 0.8 s on the mean, but in one step only (the CPU taken away once): not named
    ranks[2] = rank(0, 1.0, 0.3, 0.6, 0.1, steps=[(1.0, 1.3), (1.0, 0.5)])
    assert straggler.find(ranks, threshold=0.1) == []


def test_a_profile_folder_is_refused(tmp_path, capsys):
    from llama31_405b.cli import main
    from llama31_405b.config import load_config
    from llama31_405b.profile.capture import Plan
    from llama31_405b.profile.marker import mark_folder
    from conftest import REPO
    out = tmp_path / "prof"
    mark_folder(out, load_config(REPO / "configs" / "tiny_cpu.toml"), Plan(out=out))
    log = out / "ranks" / "result_0.txt"
    log.parent.mkdir()
    log.write_text(':::MLLOG {"key": "run_start"}\n')
    assert main(["compliance", "check", str(log)]) == 2   # refused input (docs/cli.md)
    assert "error: refused: " in capsys.readouterr().err
    assert main(["compliance", "check", str(out)]) == 2
    assert "not an MLPerf run" in capsys.readouterr().err
    assert main(["submission", "package", "--logs", str(out / "ranks"), "--org", "x",
                 "--out", str(tmp_path / "pkg")]) == 2
    assert "profile folder" in capsys.readouterr().err
    manifest = json.loads((out / "profile.json").read_text())
    assert manifest["mlperf_run"] is False


# -- a CUDA-style trace (kineto's format: host ops, cuda_runtime launches, kernels on streams,
# linked by "correlation") with kernel names as the libraries ship them:
# - cuBLAS: sm90_xmma_gemm_* (strings of libcublasLt.so.13, nvidia-cublas 13.1.1.3) and cuBLASLt's
#   nvjet_sm90_* (its name format "nvjet_sm90_%s_%dx%d_..." in the same library);
# - NCCL: ncclDevKernel_<Coll>_<Op>_<type>_<ALGO>_<PROTO>(ncclDevKernelArgsStorage<4096ul>) and
#   ncclDevKernel_SendRecv (demangled symbols of libnccl.so.2, nvidia-nccl-cu13 2.29.7);
# - cuDNN's fused attention: the runtime-compiled flash engine (generate_flash_fprop_mha_fort in
#   libcudnn_engines_runtime_compiled.so.9, nvidia-cudnn-cu13 9.20.0.48), named with sdpa and
#   flash_fprop;
# - Transformer Engine: transformer_engine::gated_act_kernel (SwiGLU; TE 2.20.2
#   common/util/vectorized_pointwise.h).
# The NCCL group comes from the host's record_param_comms op (torch 2.13 saveNcclMeta args).
GEMM_XMMA = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
             "execute_segment_k_off_kernel__5x_cublas")
GEMM_NVJET = "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT"
FLASH = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_4x1x1"
SWIGLU = ("void transformer_engine::gated_act_kernel<8, true, float, transformer_engine::Empty, "
          "&transformer_engine::silu<float, float>, __nv_bfloat16, __nv_bfloat16>(__nv_bfloat16 "
          "const*, __nv_bfloat16*, float const*, float*, float*, unsigned long, unsigned long, "
          "transformer_engine::Empty, unsigned long)")
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def launch(ts, corr, tid=MAIN):
    return ev("cudaLaunchKernel", ts, 3, tid=tid, cat="cuda_runtime", correlation=corr)


def kernel(name, ts, dur, corr, stream=7):
    return {"ph": "X", "name": name, "cat": "kernel", "ts": ts, "dur": dur, "pid": 0,
            "tid": stream, "args": {"correlation": corr, "stream": stream, "device": 0}}


def comm_op(ts, dur, desc, ranks, name="nccl:reduce_scatter"):
    return ev("record_param_comms", ts, dur, **{"Collective name": name,
                                                "Process Group Description": desc,
                                                "Process Group Ranks": ranks})


def test_gpu_trace_kernels_by_role_and_nccl_group():
    bwd_tid = 2   # autograd's device thread
    events = [
        step(0, 2000),
        ev("role:ffn_up", 10, 50, cat="user_annotation"), ev("aten::mm", 10, 40), launch(20, 1),
        ev("role:attention", 60, 40, cat="user_annotation"),
        ev("aten::_scaled_dot_product_cudnn_attention", 60, 30), launch(70, 2),
        comm_op(100, 30, "DATA_PARALLEL_GROUP_WITH_CP", [0, 2]), launch(110, 3),
        ev("role:activation", 140, 20, cat="user_annotation"), ev("aten::silu", 140, 20),
        launch(145, 4),
        ev("role:ffn_down", 170, 30, cat="user_annotation"),
        ev("aten::linear", 170, 30, **{"Sequence number": 5}), launch(180, 5),
        ev("autograd::engine::evaluate_function: MmBackward0", 300, 50, tid=bwd_tid,
           **{"Sequence number": 5}), launch(310, 6, tid=bwd_tid),
        comm_op(400, 20, "PIPELINE_MODEL_PARALLEL_GROUP", [0, 4], "nccl:send"), launch(405, 7),
        kernel(GEMM_XMMA, 100, 300, 1),
        kernel(FLASH, 400, 100, 2),
        kernel(RS, 300, 400, 3, stream=20),
        kernel(SWIGLU, 500, 50, 4),
        kernel(GEMM_NVJET, 550, 100, 5),
        kernel(GEMM_XMMA, 800, 100, 6),
        kernel(SENDRECV, 900, 100, 7, stream=21),
    ]
    ra, st = analyse(events)
    assert ra.gpu and (st.start_us, st.end_us) == (100, 1000)   # the device span of the step
    assert st.compute == {"gemm_ffn_up": approx(300e-6), "attention": approx(100e-6),
                          "activation": approx(50e-6), "gemm_ffn_down": approx(200e-6)}
    dp = st.comm["DATA_PARALLEL_GROUP_WITH_CP"]
    assert (dp.role, dp.ranks) == ("DP", [0, 2])
    assert (dp.total_s, dp.overlapped_s, dp.exposed_s) == (approx(400e-6), approx(350e-6),
                                                          approx(50e-6))
    pp = st.comm["PIPELINE_MODEL_PARALLEL_GROUP"]
    assert pp.exposed_s == approx(100e-6) and st.bubble_s == approx(100e-6)
    assert st.host_gap_s == approx(100e-6)      # 700..800: no kernel on any stream
    assert sum(st.components().values()) == approx(st.step_s)
    assert not ra.unattributed


def test_gpu_kernel_names():
    from llama31_405b.profile import attribution as at
    assert at.is_gemm_kernel(GEMM_XMMA) and at.is_gemm_kernel(GEMM_NVJET)
    assert at.is_attention_kernel(FLASH) and not at.is_gemm_kernel(FLASH)
    assert at.is_nccl_kernel(RS) and at.is_nccl_kernel(SENDRECV)
    assert at.is_nccl_kernel("ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclWorkElem)")
    assert not at.is_gemm_kernel(SWIGLU) and not at.is_attention_kernel(SWIGLU)


def test_out_folder_rules(tmp_path):
    from llama31_405b.config import load_config
    from llama31_405b.profile.capture import Plan
    from llama31_405b.profile.marker import mark_folder, unusable
    from conftest import REPO
    cfg = load_config(REPO / "configs" / "tiny_cpu.toml")
    assert unusable(tmp_path / "new") is None
    (tmp_path / "job").mkdir()                           # PROFILE=1: run_and_time.sh's lock
    (tmp_path / "job" / ".run_and_time.lock").write_text("job 7, host n1, pid 42")
    assert unusable(tmp_path / "job") is None
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.txt").write_text("x")
    assert "did not write" in unusable(tmp_path / "data")
    out = tmp_path / "prof"
    mark_folder(out, cfg, Plan(out=out))
    (out / "ranks").mkdir()
    (out / "ranks" / "rank00007.json").write_text("{}")   # an earlier profile's: kept
    assert "holds an earlier profile" in unusable(out)
    (out / "profile.json").unlink()                      # caught between marker and manifest
    assert "holds an earlier profile" in unusable(out)
    from llama31_405b.outputs import OutputExists
    with pytest.raises(OutputExists):
        mark_folder(out, cfg, Plan(out=out))
    assert [p.name for p in (out / "ranks").iterdir()] == ["rank00007.json"]


def test_compute_split_of_a_whole_trace(tmp_path):
    """No step annotation (one layer profiled on its own): the trace's span is the window."""
    from llama31_405b.profile.analysis import compute_split
    path = tmp_path / "layer.json"
    path.write_text(json.dumps({"traceEvents": [
        ev("role:ffn_up", 0, 100, cat="user_annotation"), ev("aten::mm", 0, 100),
        ev("role:ffn_down", 150, 50, cat="user_annotation"), ev("aten::mm", 150, 50)]}))
    got = compute_split(path)
    assert got["window_s"] == approx(200e-6)
    assert got["compute"] == {"gemm_ffn_up": approx(100e-6), "gemm_ffn_down": approx(50e-6)}
    assert got["components"]["host_gap"] == approx(50e-6)


def test_real_torch_trace_backward_roles(tmp_path):
    """torch.profiler on a real forward/backward of modules named like megatron's: the
    backward GEMMs (no module around them) get their role from the sequence number."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from llama31_405b.profile.analysis import compute_split
    from llama31_405b.profile.capture import annotate_modules

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear_fc1 = torch.nn.Linear(64, 256)
            self.linear_fc2 = torch.nn.Linear(256, 64)

        def forward(self, x):
            return self.linear_fc2(torch.relu(self.linear_fc1(x)))

    layer = torch.nn.Module()
    layer.mlp = MLP()
    annotate_modules([layer])
    x = torch.randn(128, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        layer.mlp(x).sum().backward()
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    c = compute_split(path)["compute"]
    # forward: one addmm each; backward: two mm each (input and weight gradient; fc1's input
    # needs no gradient, so it has one), all outside any role annotation
    raw = json.loads(path.read_text())["traceEvents"]
    backward_mm = [e for e in raw if e.get("name") == "aten::mm"]
    assert backward_mm, "the backward ran no aten::mm"
    assert c["gemm_ffn_up"] > 0 and c["gemm_ffn_down"] > 0
    # every GEMM got a role (none left as "other"); the split counts self time (children such
    # as aten::t or aten::expand are not GEMM time), so it is at most the GEMMs' inclusive time:
    # on a loaded machine the children's share grows, so no tighter bound is stable
    total_gemm = sum(e["dur"] for e in raw if e.get("name") in ("aten::mm", "aten::addmm"))
    assert "gemm_other" not in c
    assert c["gemm_ffn_up"] + c["gemm_ffn_down"] <= total_gemm * 1e-6 * (1 + 1e-6)


def test_per_rank_step_delay_rules():
    """testing.step_delay_ranks: the delay on those ranks only, ranks of the world, a delay
    set, refused on GPU systems like the other test-only delays."""
    from llama31_405b.config import ConfigError, load_config
    from conftest import REPO
    two = REPO / "configs" / "tiny_cpu_2racks.toml"     # 4 ranks
    cfg = load_config(two, overrides={"testing": {"step_delay_s": 0.5,
                                                  "step_delay_ranks": [1, 3]}})
    assert [cfg.testing.step_delay_on(r) for r in range(4)] == [0.0, 0.5, 0.0, 0.5]
    assert load_config(two, overrides={"testing": {"step_delay_s": 0.5}}).testing.step_delay_on(
        2) == 0.5
    with pytest.raises(ConfigError, match=r"step_delay_ranks \[4\]"):
        load_config(two, overrides={"testing": {"step_delay_s": 0.5, "step_delay_ranks": [4]}})
    with pytest.raises(ConfigError, match="step_delay_s is 0"):
        load_config(two, overrides={"testing": {"step_delay_ranks": [1]}})
    with pytest.raises(ConfigError, match="step_delay_ranks slow a run down"):
        load_config(REPO / "configs" / "config_GB200_2048x4x8xtp4pp8cp2.toml",
                    overrides={"testing": {"step_delay_s": 1.0, "step_delay_ranks": [0]}})
