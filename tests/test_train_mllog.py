"""The MLPerf log hook: nothing logged at construction, rank 0 only, header from header_events."""
import json
from types import SimpleNamespace

from llama31_405b.config import load_config
from llama31_405b.mlperf.header import header_events
from llama31_405b.train.hooks import StepStats
from llama31_405b.train.mllog import MLPerfLogHook


def _events(path):
    return [json.loads(l.split(":::MLLOG ", 1)[1]) for l in path.read_text().splitlines()]


def test_hook_logs_in_order_and_only_on_rank0(tmp_path):
    cfg = load_config("configs/tiny_cpu.toml")
    log0, log1 = tmp_path / "r0.txt", tmp_path / "r1.txt"
    hooks = [MLPerfLogHook(cfg, seed=7, log_file=str(p), rank=r) for r, p in ((0, log0), (1, log1))]
    assert not log0.exists() and not log1.exists()          # nothing in constructors
    run = SimpleNamespace(samples=0, step=0, run_started=False, init_stopped=False)
    for h in hooks:
        h.on_init_start(run)
        h.on_init_stop(run)
        h.on_run_start(run)
        h.on_block_start(run, 0, 320)
        h.on_step_end(run, StepStats(step=1, samples=8, loss=6.0, lr=4e-5, grad_norm=0.5,
                                     step_time_s=0.3, next_eval_step=40))
        run.samples, run.step = 8, 1
        h.on_run_stop(run, "aborted", "test")
        h.on_run_stop(run, "aborted", "twice")                # logged once
    assert not log1.exists() or log1.read_text() == ""
    ev = _events(log0)
    keys = [e["key"] for e in ev]
    header = [e.key for e in header_events(cfg, seed=7)]
    assert keys[:2] == ["cache_clear", "init_start"]
    assert keys[2:2 + len(header)] == header
    assert keys[2 + len(header):] == ["init_stop", "run_start", "block_start", "tracked_stats",
                                      "run_stop"]
    assert ev[keys.index("seed")]["value"] == 7
    stop = ev[-1]["metadata"]
    assert (stop["status"], stop["samples_count"], stop["reason"]) == ("aborted", 8, "test")
