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


def test_self_time_and_backward_gemm_by_sequence_number():
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
    # aten::t, the linear's own 10 us, the backward node's own 100 us, the add backward's 100
    assert st.compute["other"] == approx(20e-6 + 10e-6 + 100e-6 + 100e-6)
    assert st.host_gap_s == approx(1000e-6 - 700e-6)


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


def rank(pp, step_s, compute, host, exposed):
    return dict(pp_rank=pp, host="h", device="cpu", step_s=step_s, compute_s=compute,
                host_gap_s=host, exposed_s=exposed)


def test_straggler_is_the_rank_the_others_wait_on():
    # stage 0: rank 2 sleeps 0.5 s on the host, its peers wait for it; stage 1 differs by design
    ranks = {0: rank(0, 1.0, 0.3, 0.1, 0.6), 2: rank(0, 1.0, 0.3, 0.6, 0.1),
             4: rank(0, 1.0, 0.31, 0.1, 0.59), 1: rank(1, 1.0, 0.8, 0.1, 0.1),
             3: rank(1, 1.0, 0.8, 0.1, 0.1)}
    found = straggler.find(ranks, threshold=0.1)
    assert [s["rank"] for s in found] == [2]
    assert found[0]["slow_in"].startswith("host")
    assert found[0]["excess_s"] == pytest.approx(0.9 - 0.41)   # busy = step - exposed
    ranks[2] = rank(0, 1.0, 0.8, 0.1, 0.1)
    assert straggler.find(ranks)[0]["slow_in"] == "compute"
    ranks[2] = rank(0, 1.0, 0.31, 0.1, 0.59)
    assert straggler.find(ranks) == []


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
    assert main(["compliance", "check", str(log)]) == 1
    assert "REFUSED" in capsys.readouterr().err
    assert main(["compliance", "check", str(out)]) == 1
    assert "not an MLPerf run" in capsys.readouterr().err
    assert main(["submission", "package", "--logs", str(out / "ranks"), "--org", "x",
                 "--out", str(tmp_path / "pkg")]) == 1
    assert "profile folder" in capsys.readouterr().err
    manifest = json.loads((out / "profile.json").read_text())
    assert manifest["mlperf_run"] is False
