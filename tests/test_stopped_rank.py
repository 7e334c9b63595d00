"""A rank that stops answering (issue 45 item 9): SIGSTOPped past the collective timeout, it is
named in run_stop's reason and in run_and_time.sh's outcome line (train.heartbeat: per-rank
heartbeat files beside the MLPerf log), and the timeout comes from the config
(`run.collective_timeout_s`), which run_and_time.sh passes on with the config.

The end-to-end test runs under torchrun on this machine (2 gloo ranks), not under the local
Slurm cluster: the heartbeat and the reason do not depend on the launcher, and a Slurm job with
a stopped rank would add minutes of the two shared cores to `make test`."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, py_env
from test_check_log import _wait_for
from llama31_405b.mlperf.log import load_run, log_events
from llama31_405b.train import heartbeat
from llama31_405b.train.failure import lost_peer, lost_rank_reason

GLOO_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                "Timed out waiting 20000ms for recv operation to complete")


def _age(path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_the_rank_whose_heartbeat_stopped_is_named_in_the_reason(tmp_path):
    folder = heartbeat.heartbeat_dir(tmp_path / "result_0.txt")
    beats = [heartbeat.Heartbeat(folder, r, 4, 2.0) for r in range(4)]
    for b in beats:
        b.start()
    try:
        _age(beats[2].path, 40)            # stopped 40 s ago; the others beat on
        e = RuntimeError(GLOO_TIMEOUT)
        assert lost_peer(e)
        assert heartbeat.current is beats[3]     # this process's own: the last started
        reason = lost_rank_reason(e, f"RuntimeError: {GLOO_TIMEOUT}")
        assert reason == ("rank 2 (no heartbeat for 40 s) stopped answering: a collective timed "
                          "out waiting for it (RuntimeError: Timed out waiting 20000ms for recv "
                          "operation to complete)")
    finally:
        for b in beats:
            b.stop()
    # after the run: the ranks that ended normally wrote `done`; the stopped rank 2 never did
    beats[2].path.write_text("world 4 interval 2\n")
    for r in (0, 1, 3):
        _age(beats[r].path, 5)
    _age(beats[2].path, 45)
    assert heartbeat.stopped_first(tmp_path / "result_0.txt") == (
        "heartbeats: rank 2 (its last heartbeat 40 s before the other ranks' last) stopped "
        "answering first")


def test_a_rank_resumed_and_ended_after_its_stop_is_still_named(tmp_path, monkeypatch):
    """Slurm sends SIGCONT before SIGTERM to a stopped task: the rank beats again and ends (its
    file fresh, `done` written), so only the stall its own heartbeat thread recorded names it:
    the beat after the stop comes 3.2 s after the one before, past stale_after(0.2) = 1.6 s."""
    folder = heartbeat.heartbeat_dir(tmp_path / "result_0.txt")
    folder.mkdir()
    (folder / "rank_0").write_text("world 2 interval 0.2\ndone\n")
    beat = heartbeat.Heartbeat(folder, 1, 2, 0.2)
    beat.path.write_text("world 2 interval 0.2\n")
    ticks = iter([100.0, 100.2, 103.4, 103.6])        # the thread's clock: frozen 100.2-103.4
    monkeypatch.setattr(heartbeat.time, "monotonic", lambda: next(ticks))
    waits = iter([False, False, False, True])         # three beats, then stop
    monkeypatch.setattr(beat._done, "wait", lambda _timeout: next(waits))
    beat._beat()
    monkeypatch.undo()
    assert beat.path.read_text() == "world 2 interval 0.2\nstalled 3.2\n"
    beat.path.write_text(beat.path.read_text() + "done\n")      # it ended after the SIGTERM
    assert heartbeat.stopped_first(tmp_path / "result_0.txt") == (
        "heartbeats: rank 1 (3 s without a heartbeat, then resumed) stopped answering first")


def test_resumed_ranks_are_named_longest_stall_first(tmp_path):
    """make coverage's run of test_a_stopped_rank_is_named_under_slurm (2026-12-05, a loaded
    machine): rank 0's beat also paused, 6 s against the stopped rank 1's 23 s, and was named
    first, by rank order; the longest stall now comes first."""
    folder = heartbeat.heartbeat_dir(tmp_path / "result_0.txt")
    folder.mkdir()
    (folder / "rank_0").write_text("world 2 interval 1\nstalled 6.0\ndone\n")
    (folder / "rank_1").write_text("world 2 interval 1\nstalled 23.0\ndone\n")
    assert heartbeat.stopped_first(tmp_path / "result_0.txt") == (
        "heartbeats: rank 1 (23 s without a heartbeat, then resumed), rank 0 (6 s without a "
        "heartbeat, then resumed) stopped answering first")


def test_without_heartbeats_the_reason_still_says_what_happened():
    assert heartbeat.current is None
    reason = lost_rank_reason(RuntimeError(GLOO_TIMEOUT), f"RuntimeError: {GLOO_TIMEOUT}")
    assert reason == ("a rank stopped answering: a collective timed out (RuntimeError: Timed "
                      "out waiting 20000ms for recv operation to complete)")


def test_the_timeout_is_a_config_key(tmp_path):
    from llama31_405b.config import ConfigError, load_config
    cfg = tmp_path / "t.toml"
    cfg.write_text(f'base = "{REPO / "configs" / "tiny_cpu.toml"}"\n\n[run]\n'
                   "collective_timeout_s = 20\n")
    assert load_config(cfg).run.collective_timeout_s == 20
    cfg.write_text(f'base = "{REPO / "configs" / "tiny_cpu.toml"}"\n\n[run]\n'
                   "collective_timeout_s = 0\n")
    with pytest.raises(ConfigError, match=r"run\.collective_timeout_s = 0: must be > 0"):
        load_config(cfg)


def _rank_pid(script_pid: int, rank: int) -> int | None:
    import psutil
    for child in psutil.Process(script_pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "train" in child.cmdline():
                return child.pid
        except psutil.Error:
            continue
    return None


@pytest.mark.slow
@pytest.mark.stress
def test_run_and_time_names_the_stopped_rank(tiny_env, tmp_path):
    """Two ranks under torchrun, the config's collective timeout 15 s, rank 1 SIGSTOPped in a
    step: rank 0's collective times out, run_stop names rank 1, and so does the outcome line
    (torchrun SIGKILLs the stopped rank: its heartbeat file stays stale). In `make test-stress`
    (100 s): `make test` runs the same under the local Slurm cluster
    (tests/test_slurm.py::test_a_stopped_rank_is_named_under_slurm, 45 s)."""
    cfg = tmp_path / "two.toml"
    cfg.write_text(f'base = "{tiny_env["config"]}"\n\n[system]\ngpus_per_rack = 2\n\n[batch]\n'
                   "minibs = 4\n\n[run]\ncollective_timeout_s = 15\n\n"
                   "[testing]\nstep_delay_s = 1.0\n")
    logs = tmp_path / "logs"
    env = py_env() | {"CONFIG": str(cfg), "NEXP": "1", "LOGDIR": str(logs), "CLEAR_CACHES": "0",
                      "PYTHON": sys.executable}
    p = subprocess.Popen(["bash", str(REPO / "run_and_time.sh")], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pid = None
    try:
        log = logs / "result_0.txt"
        def started():
            if p.poll() is not None:      # the script ended before training: say how
                raise AssertionError(f"run_and_time.sh exited {p.returncode} before block_start:"
                                     f"\n{p.stdout.read()[-3000:]}")
            return any(e.key == "block_start" for e in log_events(log))
        try:
            _wait_for(started, 300, f"block_start in {log}")
        except AssertionError as e:
            if p.poll() is None:
                p.kill()
            raise AssertionError(f"{e}\n{p.communicate(timeout=30)[0][-3000:]}") from None
        pid = _wait_for(lambda: _rank_pid(p.pid, 1), 30, "rank 1")
        os.kill(pid, signal.SIGSTOP)
        out, _ = p.communicate(timeout=300)
    finally:
        if pid is not None:
            try:                      # nothing left behind, whatever happened
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1, out[-3000:]
    stop = load_run(logs / "result_0.txt", strict=False).events[-1]
    assert stop.key == "run_stop" and stop.metadata["status"] == "aborted"
    reason = stop.metadata["reason"]
    assert reason.startswith("rank 1 (no heartbeat for "), reason
    assert reason.endswith("stopped answering: a collective timed out waiting for it "
                           "(RuntimeError: Timed out waiting 15000ms for recv operation to "
                           "complete)") or "Timed out waiting 15000ms" in reason, reason
    assert ".cc:" not in reason, reason              # no source locations of gloo's
    line = next(ln for ln in out.splitlines() if "run 0 seed" in ln)
    assert "run_stop status aborted (rank 1 (no heartbeat for " in line, line
    assert "heartbeats: rank 1 (its last heartbeat " in line, line
