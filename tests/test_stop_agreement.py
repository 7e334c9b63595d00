"""The MLPerf log and the console agree on the step, samples and time at which a run stopped, in
every path: signal, log-write failure, NaN, lost rank, target, max steps. The loop, the log hook,
the progress hook and the log writer are the real ones; the model is not (a step here only counts:
the paths differ in when and why the loop ends, not in the arithmetic). The same comparison on a
real run under SIGTERM: tests/test_train_failure.py."""
import errno
import io
import re
import threading
from types import SimpleNamespace

import pytest

from llama31_405b.config import load_config
from llama31_405b.mlperf.log import log_events, parse_line
from llama31_405b.train.failure import StopRequest, check_finite
from llama31_405b.train.hooks import StepStats
from llama31_405b.train.loop import Run
from llama31_405b.train.mllog import MLPerfLogHook
from llama31_405b.train.progress import ProgressHook

SUMMARY = re.compile(r"\[train\] run_stop: status (\w+) after (\d+) steps, (\d+) samples, "
                     r"([\d.]+) min from run_start(?: \((.*?)\))?(; .*)?$")


class CountingRun(Run):
    """Run with the model replaced by a counter; `event(step)` acts during step `step`."""

    def __init__(self, cfg, hooks, *, evals=9.0, event=None):
        super().__init__(cfg, seed=1, hooks=hooks)
        self.eval_value, self.event = evals, event or (lambda run, step: None)

    def _init(self):
        self.info = SimpleNamespace(is_rank0=True, dp_rank=0, dp_size=1, tp_rank=0,
                                    dist_env=SimpleNamespace(rank=0))
        self.device = SimpleNamespace(gpu=False)

    def train_step(self):
        k = self.state.step
        loss = self.event(self, k + 1) or 3.0
        self.state.stop_agreed = self.stop.requested     # one rank: agreed at once
        self.state.step = k + 1
        self.state.samples = self.state.step * self.cfg.derived.gbs
        check_finite(self.state.step, loss, 1.0)
        return StepStats(step=self.state.step, samples=self.state.samples, loss=loss, lr=1e-3,
                         grad_norm=1.0, step_time_s=0.01,
                         next_eval_step=self.next_eval_step(self.state.step))

    def evaluate(self):
        return self.eval_value


def _run(tmp_path, **kw):
    cfg = load_config("configs/tiny_cpu.toml")
    log, echo, console = tmp_path / "result.txt", io.StringIO(), io.StringIO()
    mllog = MLPerfLogHook(cfg, seed=1, log_file=str(log), rank=0, echo=echo)
    run = CountingRun(cfg, [mllog, ProgressHook(cfg, rank=0, stream=console)], **kw)
    status = run.execute()
    return run, status, log, echo.getvalue(), console.getvalue()


def _agree(echo: str, console: str):
    """The log's run_stop (the echo: the file may have lost it) and the console's summary say
    the same status, step, samples and minutes; returns both."""
    events = [e for i, ln in enumerate(echo.splitlines()) if (e := parse_line(ln, "echo", i))]
    start = next(e for e in events if e.key == "run_start")
    stop = events[-1]
    assert stop.key == "run_stop"
    m = SUMMARY.search(console.strip().splitlines()[-1])
    assert m, console[-2000:]
    status, step, samples, minutes, reason, extra = m.groups()
    assert (status, int(step), int(samples)) == (stop.metadata["status"], stop.metadata["step"],
                                                 stop.metadata["samples_count"])
    assert minutes == f"{(stop.time_ms - start.time_ms) / 6e4:.3f}"
    assert (reason or "") == stop.metadata.get("reason", "")
    return stop, extra


def test_target(tmp_path):
    run, status, _, echo, console = _run(tmp_path, evals=5.5)
    stop, extra = _agree(echo, console)
    assert status == "success" and stop.metadata["step"] == run.cfg.derived.first_eval_step
    assert extra is None


def test_max_steps(tmp_path):
    run, status, _, echo, console = _run(tmp_path, evals=9.0)
    stop, _ = _agree(echo, console)
    assert status == "aborted" and stop.metadata["step"] == run.cfg.derived.max_steps
    assert stop.metadata["reason"].startswith("target 5.6 not reached")


def test_nan(tmp_path):
    _, status, _, echo, console = _run(tmp_path, event=lambda run, s: float("nan") if s == 3 else None)
    stop, _ = _agree(echo, console)
    assert stop.metadata["step"] == 3 and "non-finite training loss" in stop.metadata["reason"]


def test_signal_while_a_step_runs(tmp_path):
    """The signal comes during step 6: run_stop says 5 steps at once (the watchdog), step 6
    finishes after it; the console reports the log's 5 and says the 6th apart."""
    def event(run, step):
        if step == 6:     # the watchdog thread, as SignalWatch calls it
            t = threading.Thread(target=run._on_signal, args=("received SIGTERM",))
            t.start()
            t.join()
    run, status, _, echo, console = _run(tmp_path, event=event)
    stop, extra = _agree(echo, console)
    assert (stop.metadata["step"], stop.metadata["reason"]) == (5, "received SIGTERM")
    assert run.step == 6 and extra == "; 6 steps ran before every rank stopped"


def test_log_write_failure(tmp_path, monkeypatch):
    """The disk fills during step 4's line: the file loses the rest (its run_stop too); the copy
    on stdout ends with run_stop aborted, and the console says the same."""
    def event(run, step):
        if step == 4:
            w = run.hooks.hooks[0].writer

            def full(line, *, sync):
                raise OSError(errno.ENOSPC, "No space left on device")
            monkeypatch.setattr(w, "_to_file", full)
    _, status, log, echo, console = _run(tmp_path, event=event)
    stop, _ = _agree(echo, console)
    assert "No space left on device" in stop.metadata["reason"]
    assert not any(e.key == "run_stop" for e in log_events(log))


def test_lost_rank_then_the_launchers_signal(tmp_path):
    """A collective fails because a peer is gone: the reason says lost rank(s) with gloo's words;
    torchrun's SIGTERM, which follows, changes nothing."""
    def event(run, step):
        if step == 4:
            raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
                               "closed by peer [127.0.0.1]:41234")
    run, status, _, echo, console = _run(tmp_path, event=event)
    stop, _ = _agree(echo, console)
    assert stop.metadata["reason"].startswith("lost rank(s): a collective failed because a peer "
                                              "rank is gone (RuntimeError: [../third_party/gloo")
    assert stop.metadata["step"] == 3
    logged = []
    run.stop.signal("received SIGTERM", logged.append, run._where)
    assert logged == [] and run.stop_point.reason == stop.metadata["reason"]


def test_a_signal_first_stays_the_reason_when_the_collective_fails_after():
    stop, logged = StopRequest(), []
    stop.signal("received SIGTERM", logged.append, lambda: (5, 40))
    point = stop.settle("aborted", "lost rank(s): ...", lambda: (6, 48))
    assert logged == ["received SIGTERM"]
    assert (point.reason, point.step, point.samples) == ("received SIGTERM", 5, 40)


@pytest.mark.parametrize("text", ["Connection closed by peer [1.2.3.4]:5",
                                  "NCCL error: remote process exited or there was a network error"])
def test_lost_peer_errors_are_recognised(text):
    from llama31_405b.train.failure import lost_peer
    assert lost_peer(RuntimeError(text)) and not lost_peer(ValueError("shape mismatch"))
