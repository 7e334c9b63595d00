"""Waiting for a peer (profile/waits.py) on hand-written traces whose answers are computed by
hand: the rank that calls a collective first waits, in its exposed time, until its last peer
calls it; compute running meanwhile hides the wait; two process groups of one dimension on the
same ranks are one sequence; the pipeline group is left out (its waits are the bubble); a group
whose members ran on different hosts, were not all traced or made different numbers of calls is
not split, and says why."""
from __future__ import annotations

import pytest

from llama31_405b.profile import waits
from llama31_405b.profile.analysis import RankAnalysis
from llama31_405b.profile.trace import parse

GROUPS = [
    {"desc": "DATA_PARALLEL_GROUP", "role": "DP", "ranks": [0, 1], "tids": [20]},
    {"desc": "DATA_PARALLEL_GROUP_WITH_CP", "role": "DP", "ranks": [0, 1], "tids": [21]},
    {"desc": "PIPELINE_MODEL_PARALLEL_GROUP", "role": "PP", "ranks": [0, 1], "tids": [30]},
]


def ev(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": tid,
            "args": {}}


def rank(r: int, events: list, host: str = "node0") -> dict:
    """One rank's inputs to `peer_waits`, from its trace: one step window 0..1000 µs."""
    ra = RankAnalysis(parse({"traceEvents": [ev("profile_step#0", 0, 1000, cat="user_annotation"),
                                             *events]}),
                      {"rank": r, "main_tid": 1, "groups": GROUPS})
    return dict(ra.wait_inputs(), host=host)


def coll(ts, dur, tid=20, name="gloo:all_reduce"):
    return ev(name, ts, dur, tid=tid, cat="user_annotation")


def test_the_first_to_call_waits_for_the_last():
    # rank 0 calls at 100 and sits there until 600 (the transfer 500..600); rank 1 computes
    # until 500, then calls: rank 0 waited 400 µs (100..500), rank 1 nothing
    r0 = rank(0, [ev("aten::mm", 0, 100), coll(100, 500)])
    r1 = rank(1, [ev("aten::mm", 0, 500), coll(500, 100)])
    got, skipped = waits.peer_waits({0: r0, 1: r1})
    assert got[0] == {"DP": pytest.approx(400e-6)} and got[1] == {"DP": 0.0}
    assert skipped == {}


def test_compute_meanwhile_hides_the_wait_and_groups_of_a_dimension_are_one_sequence():
    # rank 0: a first call on DATA_PARALLEL_GROUP at 100 (overlapped by compute until 300),
    # a second on DATA_PARALLEL_GROUP_WITH_CP at 700; rank 1 calls both at 400 and 800
    r0 = rank(0, [coll(100, 400), ev("aten::mm", 100, 200), coll(700, 150, tid=21)])
    r1 = rank(1, [ev("aten::mm", 0, 400), coll(400, 100), ev("aten::mm", 500, 300),
                  coll(800, 50, tid=21)])
    got, _ = waits.peer_waits({0: r0, 1: r1})
    # first call: waits 100..400, exposed from 300: 100 µs; second: 700..800, 100 µs
    assert got[0]["DP"] == pytest.approx(200e-6)
    assert got[1]["DP"] == pytest.approx(0.0)


def test_the_pipeline_is_left_to_the_bubble():
    # a receive waiting for the previous stage, and the loss broadcast over the pipeline group
    r0 = rank(0, [ev("gloo:recv", 0, 500, tid=1, cat="user_annotation"),
                  coll(600, 300, tid=30, name="gloo:broadcast")])
    r1 = rank(1, [ev("aten::mm", 0, 500), ev("gloo:send", 500, 10, tid=1, cat="user_annotation"),
                  ev("aten::mm", 510, 380), coll(890, 10, tid=30, name="gloo:broadcast")])
    assert r0["calls"] == {} and r1["calls"] == {}
    assert waits.peer_waits({0: r0, 1: r1}) == ({0: {}, 1: {}}, {})


def test_groups_that_cannot_be_split_say_why():
    r0 = rank(0, [coll(100, 500)])
    r1 = rank(1, [coll(500, 100)], host="node1")
    got, skipped = waits.peer_waits({0: r0, 1: r1})
    assert got == {0: {}, 1: {}}
    assert skipped == {"DP:0,1": "members on 2 hosts (their clocks are not one)"}
    _, skipped = waits.peer_waits({0: r0})
    assert skipped == {"DP:0,1": "ranks [1] not traced"}
    r1 = rank(1, [coll(500, 100), coll(700, 100)])
    _, skipped = waits.peer_waits({0: r0, 1: r1})
    assert skipped == {"DP:0,1": "call counts differ between members ([1, 2])"}


def test_a_piece_begun_before_the_call_counts_from_the_call():
    """A wait window that starts inside an exposed piece begun earlier (two calls of one group
    in flight at once) counts that piece from the window's start: 50 µs of the first piece at
    full share, 100 µs of the second at half."""
    pieces = [(100.0, 200.0, 1.0), (200.0, 400.0, 0.5)]
    assert waits._overlap(150.0, 300.0, pieces, [p[0] for p in pieces]) == pytest.approx(100.0)
    assert waits._overlap(50.0, 100.0, pieces, [p[0] for p in pieces]) == 0.0
