"""Progress lines on rank 0 (stderr, so stdout stays the MLPerf log).

Per step: step, samples, loss, LR, grad norm, step time, tokens/s, MFU, ETA to the next eval.
MFU = model FLOPs per sequence (cfg.derived.model_flops_per_sequence: the non-causal Megatron
formula of the MLPerf submissions, docs/planner.md "FLOPs") x sequences per second / (ranks x the
system's dense peak for the compute precision).
"""
from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

from .hooks import Hook, StepStats

if TYPE_CHECKING:
    from ..config.schema import Config
    from .failure import StopPoint
    from .loop import Run, RunState


def mfu(cfg: Config, seconds_per_step: float) -> float:
    d = cfg.derived
    peak = d.system.peak_tflops(cfg.precision.compute) * 1e12
    if peak <= 0 or seconds_per_step <= 0:
        return 0.0
    return d.model_flops_per_sequence * d.gbs / seconds_per_step / (d.world_size * peak)


def _fmt_time(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class ProgressHook(Hook):
    def __init__(self, cfg: Config, *, rank: int, interval: int | None = None,
                 stream: TextIO | None = None) -> None:
        self.cfg, self.rank = cfg, rank
        self.interval = interval or cfg.run.log_interval
        self.stream = stream or sys.stderr
        self._times: list[float] = []
        self._t_run: float | None = None

    def _print(self, line: str) -> None:
        if self.rank == 0:
            print(line, file=self.stream, flush=True)

    def on_run_start(self, run: Run) -> None:
        self._t_run = time.perf_counter()
        d = self.cfg.derived
        self._print(f"[train] run_start: GBS {d.gbs} (MiniBS {self.cfg.batch.minibs} x DP {d.dp}), "
                    f"first eval at step {d.first_eval_step}, then every {d.eval_interval_steps}; "
                    f"target {d.target}, max steps {d.max_steps}")

    def on_step_end(self, run: Run, st: StepStats) -> None:
        self._times.append(st.step_time_s)
        if st.step % self.interval and st.step != st.next_eval_step:
            return
        recent = self._times[-10:]
        avg = sum(recent) / len(recent)
        seq = self.cfg.model.seq_length
        tok_s = self.cfg.derived.gbs * seq / st.step_time_s if st.step_time_s > 0 else 0.0
        eta = (st.next_eval_step - st.step) * avg
        self._print(f"[train] step {st.step:5d} | samples {st.samples:8d} | loss {st.loss:.4f} | "
                    f"lr {st.lr:.3e} | gnorm {st.grad_norm:.3f} | {st.step_time_s * 1e3:7.1f} ms | "
                    f"{tok_s:9.0f} tok/s | MFU {100 * mfu(self.cfg, avg):5.2f}% | "
                    f"eval@{st.next_eval_step} in {_fmt_time(eta)}")

    def on_eval_end(self, run: Run, step: int, value: float, eval_time_s: float) -> None:
        target = self.cfg.derived.target
        mark = "<= target" if value <= target else "> target"
        self._print(f"[eval]  step {step:5d} | samples {run.samples:8d} | log perplexity {value:.4f} "
                    f"({mark} {target}) | {eval_time_s:.1f} s")

    def on_signal(self, run: Run, reason: str) -> None:
        self._print(f"[train] {reason}: run_stop aborted logged; stopping at the next step")

    def on_run_stop(self, run: Run, status: str, reason: str) -> None:
        state: RunState | None = getattr(run, "state", None)
        if state is not None and not state.run_started:
            return   # the train command says "stopped before run_start: <reason>" (one line)
        # the values of the log's run_stop (train.failure.StopPoint, fixed once): a step under
        # way when a signal came may finish after it; that is said apart
        point: StopPoint | None = getattr(run, "stop_point", None)
        start_ms: int | None = getattr(state, "run_start_ms", None)
        if point is not None and start_ms is not None:
            step, samples, minutes = point.step, point.samples, (point.time_ms - start_ms) / 6e4
        else:
            step, samples = run.step, run.samples
            minutes = (time.perf_counter() - self._t_run) / 60 if self._t_run else 0.0
        extra = (f"; {run.step} steps ran before every rank stopped" if run.step != step else "")
        self._print(f"[train] run_stop: status {status} after {step} steps, {samples} samples, "
                    f"{minutes:.3f} min from run_start" + (f" ({reason})" if reason else "")
                    + extra)
