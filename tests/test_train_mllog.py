"""The MLPerf log hook: nothing logged at construction, rank 0 only, header from header_events;
run_stop exactly once (the signal path first wins); a failed write stops the run with one error
line and never ends in success."""
import io
import os
from types import SimpleNamespace

import pytest

from llama31_405b.config import load_config
from llama31_405b.mlperf.header import header_events
from llama31_405b.mlperf.log import load_run, parse_line
from llama31_405b.train.failure import RunAborted
from llama31_405b.train.hooks import StepStats
from llama31_405b.train.mllog import MLPerfLogHook

CFG = "configs/tiny_cpu.toml"
STATS = StepStats(step=1, samples=8, loss=6.0, lr=4e-5, grad_norm=0.5, step_time_s=0.3,
                  next_eval_step=40)


def _run(**kw):
    return SimpleNamespace(samples=0, step=0, run_started=False, init_stopped=False, **kw)


def _echoed(stream: io.StringIO):
    return [parse_line(ln, "<echo>", i) for i, ln in enumerate(stream.getvalue().splitlines())]


def test_hook_logs_in_order_and_only_on_rank0(tmp_path):
    cfg = load_config(CFG)
    log0, log1 = tmp_path / "r0.txt", tmp_path / "r1.txt"
    hooks = [MLPerfLogHook(cfg, seed=7, log_file=str(p), rank=r, echo=False)
             for r, p in ((0, log0), (1, log1))]
    assert not log0.exists() and not log1.exists()          # nothing in constructors
    run = _run()
    for h in hooks:
        h.on_init_start(run)
        h.on_init_stop(run)
        h.on_run_start(run)
        h.on_block_start(run, 0, 320)
        h.on_step_end(run, STATS)
        run.samples, run.step = 8, 1
        h.on_run_stop(run, "aborted", "test")
        h.on_run_stop(run, "aborted", "twice")                # logged once
    assert not log1.exists() or log1.read_text() == ""
    ev = load_run(log0).events
    keys = [e.key for e in ev]
    header = [e.key for e in header_events(cfg, seed=7)]
    assert keys[:2] == ["cache_clear", "init_start"]
    assert keys[2:2 + len(header)] == header
    assert keys[2 + len(header):] == ["init_stop", "run_start", "block_start", "tracked_stats",
                                      "run_stop"]
    assert ev[keys.index("seed")].value == 7
    # the package checker's seed check reads file and line: the hook method that logged it
    assert ev[keys.index("seed")].metadata["file"] == "llama31_405b/train/mllog.py"
    stop = ev[-1].metadata
    assert (stop["status"], stop["samples_count"], stop["reason"]) == ("aborted", 8, "test")


def test_signal_logs_run_stop_at_once_and_the_log_ends_there(tmp_path):
    log = tmp_path / "r.txt"
    hook = MLPerfLogHook(load_config(CFG), seed=1, log_file=str(log), rank=0, echo=False)
    run = _run()
    hook.on_init_start(run)
    hook.on_run_start(run)
    hook.on_signal(run, "received SIGTERM")          # what the watchdog thread calls
    assert load_run(log).events[-1].key == "run_stop"
    hook.on_step_end(run, STATS)                     # the main thread finishing its step
    hook.on_run_stop(run, "aborted", "received SIGTERM")
    ev = load_run(log).events
    assert [e.key for e in ev].count("run_stop") == 1 and ev[-1].key == "run_stop"
    assert ev[-1].metadata["status"] == "aborted"
    assert ev[-1].metadata["reason"] == "received SIGTERM"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_failed_write_after_run_start_asks_every_rank_to_stop(capsys):
    """/dev/full: every write fails with ENOSPC, as on a full disk."""
    asked = []
    run = _run(request_stop=lambda reason, error: asked.append((reason, error)))
    run.run_started = True
    echo = io.StringIO()
    hook = MLPerfLogHook(load_config(CFG), seed=1, log_file="/dev/full", rank=0, echo=echo)
    hook.on_step_end(run, STATS)
    hook.on_step_end(run, STATS)                     # nothing more is tried, nothing printed
    hook.on_run_stop(run, "success", "")             # e.g. the same eval reached the target
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: cannot write the MLPerf log /dev/full: No space left on device "
                   "(ENOSPC); stopping the run"]
    assert asked == [("cannot write the MLPerf log /dev/full: No space left on device (ENOSPC)",
                      True)]
    stops = [e for e in _echoed(echo) if e.key == "run_stop"]
    assert len(stops) == 1 and stops[0].metadata["status"] == "aborted"
    assert "/dev/full" in stops[0].metadata["reason"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_failed_write_before_run_start_stops_at_once(capsys):
    hook = MLPerfLogHook(load_config(CFG), seed=1, log_file="/dev/full", rank=0, echo=False)
    with pytest.raises(RunAborted, match="/dev/full: No space left on device"):
        hook.on_init_start(_run())
    # the train command prints the one line ("stopped before run_start: <reason>"), not the hook
    assert capsys.readouterr().err.count("error:") == 0


def test_unwritable_log_path_is_named(tmp_path, capsys):
    missing = tmp_path / "no_such_dir" / "result_0.txt"
    hook = MLPerfLogHook(load_config(CFG), seed=1, log_file=str(missing), rank=0, echo=False)
    with pytest.raises(RunAborted, match=f"cannot open the MLPerf log {missing}: No such file"):
        hook.on_init_start(_run())
