"""Before launch: the real compliance checker on the events a config will log, plus what the
checker cannot see before a run.

The header is `mlperf.header_events(cfg, seed=...)`, the function the training loop logs. The
checker also REQuires events only a run produces; `synthetic_run_events` adds the minimum of them,
with values that carry no information about the config:
- cache_clear, init_start, init_stop (1 s after init_start), run_start: the common rules' REQ
  and order checks (init_stop within 30 min of init_start, run_start after init_stop);
- one block_start/block_stop and eval_start/eval_stop with samples_count = the first evaluation
  of the schedule (cfg.derived.first_eval_step x GBS): the AT_LEAST_ONE_OR(block/epoch) rules;
- eval_accuracy = the target, at those samples: the closed rule "at least one eval_accuracy in
  (0, target]" (convergence itself is only known after the run);
- run_stop with status success: REQ run_stop with a status.
Every other rule (all hyperparameters, GBS, eval_samples, max_sequence_length, the 6.0 optional
keys, submission_*) is evaluated on the header values exactly as logged.

Beyond the checker: the GBS must be covered by the reference convergence points (`rcp.reference`),
the configured runs need distinct seeds (seed_base + i, or drawn from the system's entropy; one
(file, line, value) each for the seed checker) and the number of runs the package checker wants, and the rank layout must keep every
model-parallel group inside a rack (`config.validate.problems`).
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.schema import Config
from ..config.seeds import run_seeds, seed_is_drawn
from ..mlperf.header import Event, header_events
from ..mlperf.checker import RULESET, CheckResult, config_for, run_checker
from ..mlperf.log import format_line

HEADER_SOURCE = "llama31_405b/mlperf/header.py"


def synthetic_run_events(cfg: Config) -> tuple[list[Event], list[Event]]:
    """(before the header, after the header): the minimal run events the checker REQuires."""
    d = cfg.derived
    samples = d.first_eval_step * d.gbs
    before = [Event("cache_clear", True), Event("init_start", None)]
    after = [
        Event("init_stop", None), Event("run_start", None),
        Event("block_start", None, {"samples_count": 0}),
        Event("block_stop", None, {"samples_count": samples}),
        Event("eval_start", None, {"samples_count": samples}),
        Event("eval_accuracy", d.target, {"samples_count": samples}),
        Event("eval_stop", None, {"samples_count": samples}),
        Event("run_stop", None, {"samples_count": samples, "status": "success"}),
    ]
    return before, after


def log_lines(header: list[Event], cfg: Config) -> list[str]:
    """The MLLOG lines of a run whose header is `header` (synthetic run events around it)."""
    before, after = synthetic_run_events(cfg)
    t0 = 1_700_000_000_000
    out = []
    for i, ev in enumerate(before):
        out.append(format_line(ev.key, ev.value, time_ms=t0 + i,
                               metadata={"file": "synthetic", "lineno": i, **ev.metadata}))
    for i, ev in enumerate(header):
        out.append(format_line(ev.key, ev.value, time_ms=t0 + 10 + i,
                               metadata={"file": HEADER_SOURCE, "lineno": 1 + i, **ev.metadata}))
    for i, ev in enumerate(after):
        out.append(format_line(ev.key, ev.value, time_ms=t0 + 1000 + i,
                               metadata={"file": "synthetic", "lineno": 100 + i, **ev.metadata}))
    return out


def check_events(header: list[Event], cfg: Config, *, ruleset: str = RULESET,
                 workdir: str | Path | None = None) -> CheckResult:
    """Run the real checker on `header` plus the synthetic run events."""
    bench = next((str(e.value) for e in header if e.key == "submission_benchmark"), None)
    rules = config_for(bench, ruleset, cfg.run.division)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        src = Path(cfg.source).name if cfg.source else "config"
        path = Path(tmp) / f"precheck_{Path(src).stem}.log"
        path.write_text("\n".join(log_lines(header, cfg)) + "\n")
        res = run_checker(path, rules, ruleset)
    res.path = cfg.source or "<config>"
    return res


@dataclass(slots=True)
class PrecheckResult:
    source: str
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    check: Any = None

    @property
    def ok(self) -> bool:
        return not self.errors


def precheck_config(cfg: Config, *, ruleset: str = RULESET) -> PrecheckResult:
    from ..config.validate import problems
    from .package import run_count
    from .rcp import reference

    out = PrecheckResult(source=cfg.source or "<config>")
    layout = problems(cfg)
    if layout:
        out.errors += [f"config: {p}" for p in layout]
        return out
    d = cfg.derived
    out.seeds = list(run_seeds(cfg.run.seed_base, cfg.run.num_runs))
    if seed_is_drawn(cfg):
        out.notes.append("seeds: drawn per run from the system's entropy (run.seed_base unset); "
                         "checked here with one such draw")
    headers = [header_events(cfg, seed=s) for s in out.seeds]
    logged = [next(e.value for e in h if e.key == "seed") for h in headers]
    if len(set(logged)) != len(logged):
        out.errors.append(f"seeds {logged}: the runs of one submission need distinct seeds "
                          "(the package checker rejects a seed logged twice on the same line)")
    want = run_count(d.rules.name)
    if cfg.run.num_runs != want:
        out.errors.append(f"run.num_runs = {cfg.run.num_runs}: a {d.rules.name} submission has "
                          f"exactly {want} result files")
    res = check_events(headers[0], cfg, ruleset=ruleset)
    out.check = res
    if not res.ok:
        out.errors += [f"compliance checker: {s}" for s in res.summary(locate=False)]
    if cfg.run.division == "closed":
        try:
            ref = reference(d.rules.name, d.gbs, ruleset)
        except FileNotFoundError as e:
            out.errors.append(str(e))
        else:
            (out.notes if ref.covered else out.errors).append(f"RCP: {ref.describe()}")
    p = cfg.parallel
    node_cp = p.tp * p.cp <= d.gpus_per_rack
    where = (f"inside one {d.gpus_per_rack}-GPU rack, {d.replicas_per_rack} per rack"
             if d.replicas_per_rack else
             f"over {d.racks_per_replica} nodes of {d.gpus_per_rack} GPUs (TP{', CP' if node_cp else ''}"
             f" inside a node; PP{'' if node_cp else ' and CP'} across nodes)")
    out.notes.append(f"layout: TP{cfg.parallel.tp}-PP{cfg.parallel.pp}-CP{cfg.parallel.cp} = "
                     f"{d.model_parallel_size} GPUs per model replica {where}, DP {d.dp}")
    return out


def cross_config_problems(results: list[tuple[Config, PrecheckResult]]) -> list[str]:
    """Configs that would submit the same benchmark on the same platform must not share seeds."""
    seen: dict[tuple[str, str], tuple[str, set[int]]] = {}
    out = []
    for cfg, res in results:
        key = (cfg.derived.rules.name, cfg.derived.platform)
        if key in seen and seen[key][1] & set(res.seeds):
            out.append(f"{res.source} and {seen[key][0]}: both submit {key[0]} on platform "
                       f"{key[1]!r} with seeds {sorted(seen[key][1] & set(res.seeds))} in common")
        seen.setdefault(key, (res.source, set(res.seeds)))
    return out
