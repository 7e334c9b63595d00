"""bench/host_where.py on a hand-written trace: its host pieces add up to the analysis' host gap,
and each piece goes to the innermost op holding it, else to the innermost annotation."""
from __future__ import annotations

import pytest

from bench.host_where import OUTSIDE, holders, host_pieces
from llama31_405b.profile.analysis import RankAnalysis
from llama31_405b.profile.trace import parse

MAIN = 1
META = {"rank": 0, "main_tid": MAIN, "groups": [
    {"desc": "TENSOR_MODEL_PARALLEL_GROUP", "role": "TP", "ranks": [0, 1], "tids": [10]}]}


def ev(name, ts, dur, tid=MAIN, cat="cpu_op"):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": tid,
            "args": {}}


def test_host_pieces_are_the_host_gap_and_go_to_their_holder():
    events = [
        ev("profile_step#0", 0, 1000, cat="user_annotation"),
        ev("role:ffn_up", 0, 300, cat="user_annotation"),
        ev("aten::mm", 0, 100),                               # compute 0..100
        # 100..200 Python inside the role, no op: host, held by the role's annotation
        ev("_ReduceFromModelParallelRegion", 200, 300),       # a TP Function
        ev("c10d::allreduce_", 220, 250),                     # its call
        ev("gloo:all_reduce", 230, 150, tid=10, cat="user_annotation"),   # TP 230..380
        # 380..470 the call's own time after the collective: host, held by c10d::allreduce_;
        # 470..500 the Function's own time: host; 200..220 the Function's, 220..230 the call's
        ev("aten::add", 600, 100),                            # compute 600..700
    ]                                                         # 500..600, 700..1000: the step's
    ra = RankAnalysis(parse({"traceEvents": events}), META)
    (pieces,) = host_pieces(ra)
    assert sum(e - s for s, e in pieces) == pytest.approx(ra.steps[0].host_gap_s * 1e6)
    got = holders(parse({"traceEvents": events}).events, pieces)
    assert got == pytest.approx({
        f"{OUTSIDE} in role:ffn_up": 100.0,
        "_ReduceFromModelParallelRegion": 20.0 + 30.0,
        "c10d::allreduce_": 10.0 + 90.0,
        f"{OUTSIDE} in profile_step": 100.0 + 300.0})


def test_calls_are_counted_per_step_in_the_step_windows():
    from bench.host_where import calls_per_step
    events = parse({"traceEvents": [ev("c10d::allreduce_", t, 10) for t in (5, 50, 150, 250)]
                    + [ev("aten::mm", 60, 5)]}).events
    windows = [(0, 100), (100, 200)]            # the call at 250 is outside both
    assert calls_per_step(events, windows, {"c10d::allreduce_"}) == {"c10d::allreduce_": 1.5}
