"""Memory before launch: does a GPU config fit the GPU's memory, by the planner's memory model?

`memory_problems(cfg)` is what `config check`, `compliance precheck` and the launch pre-flight
refuse a config for: its predicted memory per GPU (memory.py: weights, gradients, optimizer
state, activations, the allocator's fragmentation, a reserve) exceeds the system's capacity. The
message names the breakdown and the changes that would make it fit (full recomputation, larger
TP or PP, smaller MBS), with their predicted memory. `run.accept_memory_risk = true` accepts the
risk for an experiment: the config is not refused, and `memory_note(cfg)` is the line every one
of those commands prints instead. CPU configs (no GPU memory to model) are never refused; layouts
the config validator rejects are left to its messages.

Each takes `fit`, a calibration's constants (`calibration_fit` reads and checks the file given
with `--calibration FILE`): where the calibration's profile recorded GPU memory, its activation
scale and fragmentation replace the assumed ones (memory.py); otherwise nothing changes.
"""
from __future__ import annotations

from dataclasses import replace

from ..config.schema import Config
from ..config.validate import model_layout_rules, placement_rules, problems
from ..systems import load_system
from .calibrate.constants import Fitted
from .context import Context
from .memory import Memory, memory
from .spec import pipeline_split_flags

RISK_FIELD = "run.accept_memory_risk"


def calibration_fit(path: str, cfg: Config) -> Fitted:
    """The constants of the calibration file `path` for `cfg`; ValueError naming the file (and,
    for a calibration of another system, model or GEMM precision, the field and both values)."""
    from .calibrate.file import mismatches, read
    cal = read(path)
    bad = mismatches(cal, cfg)
    if bad:
        raise ValueError("; ".join(bad))
    return cal.fit


def predicted(cfg: Config, fit: Fitted | None = None) -> Memory:
    return memory(Context.of(cfg), fit)


def _gb(mem: Memory) -> str:
    return f"{mem.total_gb:.0f} GB"


def alternatives(cfg: Config, fit: Fitted | None = None) -> list[tuple[str, Memory]]:
    """Changes to the config that would fit, with their predicted memory (first the ones that
    keep the layout)."""
    p, perf, b = cfg.parallel, cfg.performance, cfg.batch
    m = cfg.model
    out: list[tuple[str, Config]] = []
    if perf.recompute != "full":
        full = replace(cfg, performance=replace(perf, recompute="full"))
        out.append(('performance.recompute = "full"', full))
    if b.micro_batch_size > 1:
        mbs = b.micro_batch_size // 2
        smaller = replace(cfg, batch=replace(b, micro_batch_size=mbs))
        out.append((f"batch.micro_batch_size = {mbs}", smaller))
    tp = p.tp * 2
    if m.num_attention_heads % tp == 0 and m.num_query_groups % tp == 0:
        out.append((f"parallel.tp = {tp}", replace(cfg, parallel=replace(p, tp=tp))))
    pp = p.pp * 2
    for vp in (p.vp, p.vp // 2, 1):
        flags = pipeline_split_flags(m.num_layers, pp, max(vp, 1)) if vp >= 1 else None
        if flags is not None:
            what = f"parallel.pp = {pp}" + (f", parallel.vp = {vp}" if vp != p.vp else "")
            out.append((what, replace(cfg, parallel=replace(p, pp=pp, vp=vp), performance=replace(
                perf, account_for_embedding_in_pipeline_split=flags[0],
                account_for_loss_in_pipeline_split=flags[1]))))
            break
    fits = []
    for what, alt in out:
        d = alt.derived
        if placement_rules(alt, d) or model_layout_rules(alt, d):  # not a layout of this system
            continue
        try:
            mem = predicted(alt, fit)
        except (ValueError, ZeroDivisionError):
            continue
        if mem.fits:
            fits.append((what, mem))
    return fits


def memory_problems(cfg: Config, fit: Fitted | None = None) -> list[str]:
    """Why a GPU config cannot be launched for memory ([] when it fits, runs on CPU, is not a
    valid layout, or run.accept_memory_risk accepts the risk)."""
    if not load_system(cfg.system.id).is_gpu or problems(cfg) or cfg.run.accept_memory_risk:
        return []
    mem = predicted(cfg, fit)
    if mem.fits:
        return []
    alts = alternatives(cfg, fit)
    fix = ("; it would fit with " + " or ".join(f"{w} ({_gb(mm)})" for w, mm in alts)) if alts else (
        "; none of full recomputation, twice the TP or PP, or half the MBS fits either")
    return [f"predicted memory per GPU does not fit {cfg.system.id} ({mem.why_not()}){fix}; to "
            f"launch it anyway as an experiment set {RISK_FIELD} = true"]


def memory_note(cfg: Config, fit: Fitted | None = None) -> str | None:
    """The line echoed when the config accepts the memory risk (None otherwise)."""
    if not cfg.run.accept_memory_risk:
        return None
    if not load_system(cfg.system.id).is_gpu or problems(cfg):
        return f"{RISK_FIELD} = true (memory risk accepted; no GPU memory prediction for this config)"
    mem = predicted(cfg, fit)
    verdict = "fits" if mem.fits else "DOES NOT FIT, launched anyway"
    return (f"{RISK_FIELD} = true: memory risk accepted, predicted {mem.total_gb:.0f} of "
            f"{mem.capacity_gb:.0f} GB per GPU ({verdict})")
