"""The pre-flight's all-gather over plain TCP (llama31_405b/parallel/gather.py): ranks as separate
processes that import no torch, as `launch preflight` runs them; every rank gets every rank's
object in rank order; a rank that never joins is named by rank 0 within the timeout, the others
hear that rank 0 gave up; a wrong world size, a rank joining twice and a stray client are handled;
rank 0 refuses a world its open-file limit cannot hold."""
from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers.ports import free_port
from helpers.coverage_env import coverage_env
from llama31_405b.parallel import gather as g

REPO = Path(__file__).resolve().parents[1]

# one rank: prints its result (or its error) as JSON
RANK = """
import json, sys
from llama31_405b.parallel.gather import GatherError, all_gather
rank, world, port, timeout = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
try:
    out = all_gather({"rank": rank, "host": "node%d" % (rank // 4)}, rank=rank, world_size=world,
                     addr="127.0.0.1", port=port, timeout_s=timeout)
    print(json.dumps({"ok": out, "torch": "torch" in sys.modules}))
except GatherError as e:
    print(json.dumps({"error": str(e), "from_rank0": e.from_rank0}))
"""


def _ranks(ranks, world: int, timeout: float = 60.0) -> dict[int, dict]:
    port = free_port()
    procs = {r: subprocess.Popen([sys.executable, "-c", RANK, str(r), str(world), str(port),
                                  str(timeout)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                                 env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                                      **coverage_env()})
             for r in ranks}
    return {r: json.loads(p.communicate(timeout=timeout + 60)[0]) for r, p in procs.items()}


def test_every_rank_gets_every_object_in_rank_order_without_torch():
    out = _ranks(range(12), 12)
    want = [{"rank": r, "host": f"node{r // 4}"} for r in range(12)]
    for r, res in out.items():
        assert res["ok"] == want, r
        assert res["torch"] is False


def test_a_rank_that_never_joins_is_named_by_rank_0():
    out = _ranks([0, 1, 3], 4, timeout=4)
    assert "1 of 4 ranks did not join the pre-flight before the timeout (ranks 2)" \
        in out[0]["error"]
    for r in (1, 3):
        assert out[r]["from_rank0"] is True
        assert "rank 0 (127.0.0.1" in out[r]["error"]


def test_without_rank_0_the_others_say_so():
    out = _ranks([1], 2, timeout=2)
    assert "could not reach rank 0 at 127.0.0.1" in out[1]["error"]
    assert out[1]["from_rank0"] is False          # nobody else will say it: this rank does


def _serve_in_thread(world: int, port: int, timeout: float = 10.0) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run():
        try:
            box["ok"] = g.all_gather("zero", rank=0, world_size=world, addr="127.0.0.1",
                                     port=port, timeout_s=timeout)
        except g.GatherError as e:
            box["error"] = str(e)
    t = threading.Thread(target=run)
    t.start()
    return t, box


def _send(port: int, data: bytes) -> socket.socket:
    for _ in range(200):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(data)
            return s
        except ConnectionRefusedError:
            threading.Event().wait(0.05)
    raise AssertionError("rank 0 never listened")


def test_a_rank_of_another_world_size_is_refused():
    port = free_port()
    t, box = _serve_in_thread(3, port)
    s = _send(port, g._HEADER.pack(g.MAGIC, 1, 4, 1) + b"x")
    t.join(15)
    s.close()
    assert "rank 1 reports a world of 4 ranks, rank 0 one of 3" in box["error"]


def test_a_rank_joining_twice_is_refused():
    port = free_port()
    t, box = _serve_in_thread(3, port)
    import pickle
    p = pickle.dumps("one")
    a = _send(port, g._HEADER.pack(g.MAGIC, 1, 3, len(p)) + p)
    b = _send(port, g._HEADER.pack(g.MAGIC, 1, 3, len(p)) + p)
    t.join(15)
    a.close(), b.close()
    assert "rank 1 joined twice or is out of range (world 3)" in box["error"]


def test_a_stray_client_is_ignored():
    port = free_port()
    t, box = _serve_in_thread(2, port)
    stray = _send(port, b"GET / HTTP/1.0\r\n\r\n")
    res = g.all_gather("one", rank=1, world_size=2, addr="127.0.0.1", port=port, timeout_s=10)
    t.join(15)
    stray.close()
    assert res == box["ok"] == ["zero", "one"]


def _fake_rank0(then) -> tuple[socket.socket, threading.Thread]:
    """A rank 0 that reads one rank's whole message (so that its close is a FIN, not a RST),
    then calls `then(conn)` and closes."""
    server = socket.create_server(("127.0.0.1", 0))

    def run():
        conn, _ = server.accept()
        with conn:
            head = b""
            while len(head) < g._HEADER.size:
                head += conn.recv(g._HEADER.size - len(head))
            left = g._HEADER.unpack(head)[3]
            while left:
                left -= len(conn.recv(left))
            then(conn)
    t = threading.Thread(target=run)
    t.start()
    return server, t


@pytest.mark.parametrize("then, timeout, says", [
    # read the message, sent half of the answer's length, closed (rank 0 failed): not a
    # truncated unpickle, but rank 0's failure pointed at
    (lambda conn, done: conn.sendall(b"\x00\x00"), 10,
     r"rank 1: rank 0 \(127.0.0.1:\d+\) closed the connection before answering"),
    # held the connection and never answered (waiting for ranks that never join): the rank
    # stops at its timeout and says rank 0 lists who is missing
    (lambda conn, done: done.wait(30), 1,
     r"rank 1: no answer from rank 0 \(127.0.0.1:\d+\) before the timeout"),
], ids=["closed mid-answer", "silent past the timeout"])
def test_a_rank_0_that_fails_after_reading_is_said_by_the_rank(then, timeout, says):
    done = threading.Event()
    server, t = _fake_rank0(lambda conn: then(conn, done))
    try:
        with pytest.raises(g.GatherError, match=says) as e:
            g.all_gather("one", rank=1, world_size=2, addr="127.0.0.1",
                         port=server.getsockname()[1], timeout_s=timeout)
        assert e.value.from_rank0 is True
    finally:
        done.set()
        t.join(15)
        server.close()


def test_rank_0_refuses_a_world_its_file_limit_cannot_hold(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda what: (1024, 4096))
    with pytest.raises(g.GatherError, match="8192 ranks need 8256 open files, and this process "
                                            r"may open at most 4096 \(ulimit -Hn\)"):
        g.all_gather("x", rank=0, world_size=8192, addr="127.0.0.1", port=free_port(),
                     timeout_s=1)


def test_one_rank_needs_no_network():
    assert g.all_gather("x", rank=0, world_size=1, addr="nowhere.invalid", port=1,
                        timeout_s=0) == ["x"]
