"""The rank a run lost, named in its MLPerf log (train.siblings): real processes started by
this one stand for the ranks a launcher starts on one node."""
import io
import os
import signal
import subprocess
import sys
import time


def test_siblings_name_the_rank_whose_process_ended():
    """train.siblings on real processes: three 'ranks' started by this process; one killed is
    named while it is a zombie (its launcher has not reaped it) and after it is reaped; the
    signal's reason names it."""
    from llama31_405b.train import failure
    from llama31_405b.train.siblings import Siblings
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env=dict(os.environ, RANK=str(r))) for r in (1, 2, 3)]
    try:
        t0 = time.monotonic()
        while True:     # the children's environment is readable once they exist
            sib = Siblings.snapshot(parent=os.getpid(), me=-1)
            if len(sib.ranks) == 3 or time.monotonic() - t0 > 30:
                break
            time.sleep(0.1)
        assert sib.ranks == {1: kids[0].pid, 2: kids[1].pid, 3: kids[2].pid}
        assert sib.lost() == []
        os.kill(kids[2].pid, signal.SIGKILL)
        t0 = time.monotonic()
        while sib.lost() == [] and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        assert sib.lost() == [3]                 # a zombie: not reaped yet
        kids[2].wait()
        assert sib.lost() == [3]                 # gone
        old, failure._siblings = failure._siblings, sib
        try:
            watch = failure.SignalWatch(on_signal=lambda r: None)
            watch.received = signal.SIGTERM
            assert watch.reason() == ("rank 3 lost (its process ended); received SIGTERM from "
                                      "the launcher")
            assert failure.lost_rank_reason(RuntimeError("x"), "gloo: closed").startswith(
                "rank 3 lost (its process ended): a collective failed")
            kids[1].kill()
            kids[1].wait()
            assert watch.reason().startswith("ranks 2, 3 lost (their processes ended); ")
            failure._siblings = Siblings(parent=os.getpid())
            assert watch.reason() == "received SIGTERM"
            # a real SIGTERM to this process: the reason is fixed when the signal comes, so a
            # rank that ends later (e.g. at its own grace exit) is not named as the cause
            got = []
            live = failure.SignalWatch(on_signal=got.append, grace_s=120).install()
            try:
                failure._siblings = sib
                os.kill(os.getpid(), signal.SIGTERM)
                t0 = time.monotonic()
                while not got and time.monotonic() - t0 < 30:
                    time.sleep(0.05)
                assert got == ["ranks 2, 3 lost (their processes ended); received SIGTERM from "
                               "the launcher"]
                kids[0].kill()
                kids[0].wait()
                assert live.reason() == got[0]
            finally:
                live.uninstall()
        finally:
            failure._siblings = old
    finally:
        for k in kids:
            k.kill()
            k.wait()


def test_a_rank_still_exiting_is_named_lost(monkeypatch):
    """A killed rank closes its sockets inside do_exit, before it turns zombie: a peer whose
    collective fails at that moment reads its state as running. Its PF_EXITING flag is set by
    then, and names it lost (the reason of run_stop then names the rank, not "lost rank(s)")."""
    from llama31_405b.train import siblings
    line = {101: "101 (python3 -m x) R 50 101 7 0 -1 {flags} 5 0 0 0 20 3 0 0 20 0 9 0",
            102: "102 (python3 -m x) S 50 102 7 0 -1 {flags} 5 0 0 0 20 3 0 0 20 0 9 0"}
    flags = {101: 0x40404C, 102: 0x404048}                # 101: PF_EXITING (0x4) set
    monkeypatch.setattr(siblings, "open", lambda path, mode: io.BytesIO(
        line[int(path.split("/")[2])].format(flags=flags[int(path.split("/")[2])]).encode()),
        raising=False)
    sib = siblings.Siblings(parent=50, ranks={1: 101, 2: 102})
    assert siblings._stat(101) == ("X", 50) and siblings._stat(102) == ("S", 50)
    assert sib.lost() == [1]

