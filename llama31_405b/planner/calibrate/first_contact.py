"""First contact's report -> a partial calibration: the BF16 GEMM efficiency of one layer
(`plan --calibrate REPORT.json`), every other constant the prior's."""
from __future__ import annotations

from pathlib import Path

from .read_profile import ProfileSummaryError, _read
from .summary import Summary


def first_contact(path: str | Path, prior, system: str | None = None):
    """A partial calibration from first contact's report (its `layer_bf16` check: forward +
    backward of one 405B-width layer in BF16 with megatron-core's local, unfused attention, at
    two shapes). The layer time fixes one constant: the BF16 GEMM efficiency, solved so that the
    planner's time of the "full" layer, with the unfused attention that ran, is the measured
    one; everything else stays `prior`. Returns (Fitted, Summary, check), the check holding
    both shapes' predicted and measured times (the "tp4_shard" one is a prediction). The report
    names its GPU, not always the system file: `system` when it does not."""
    from dataclasses import replace as _replace

    from ...config.schema import ModelConfig
    from .. import compute
    from ..context import Context
    from ..spec import make_config
    path = Path(path)
    doc = _read(path, "give the JSON report of `python -m llama31_405b first-contact`")
    checks = {c.get("name"): c for c in doc.get("checks", [])}
    layer = checks.get("layer_bf16")
    if not layer or layer.get("status") != "passed":
        raise ProfileSummaryError(f"{path}: no passed layer_bf16 check (first contact's layer "
                                  "phase): nothing to calibrate from")
    named = (doc.get("meta") or {}).get("system")
    if named and system and named != system:
        raise ProfileSummaryError(f"{path}: first contact ran on system {named!r}, --system asks "
                                  f"for {system!r}")
    system = named or system
    if not system:
        gpu = (checks.get("gpu") or {}).get("data", {}).get("name", "not recorded")
        raise ProfileSummaryError(f"{path}: the report does not name the system (its GPU: {gpu}); "
                                  "give --system (llama31_405b/systems/*.toml)")
    rows = {k: v for k, v in layer.get("data", {}).items() if isinstance(v, dict) and "fwd_s" in v}
    if "full" not in rows:
        raise ProfileSummaryError(f"{path}: layer_bf16 has no 'full' shape")

    def layer_s(shape: dict, fit) -> float:
        tp = 128 // shape["heads"]
        cfg = make_config(system, 1, tp=tp, pp=1, vp=1, cp=1, minibs=1, precision="bf16",
                          model=ModelConfig(seq_length=shape["seq"]))
        ctx = Context.of(cfg)
        ctx = _replace(ctx, system=_replace(ctx.system, attention_kernel="unfused"))
        fwd, bwd = compute.chunk_parts(ctx, 1, False, False, fit)
        return fwd.total + bwd.total

    full = rows["full"]
    measured = full["fwd_s"] + full["bwd_s"]
    lo, hi = 1e-3, 1.0
    fit = prior
    for _ in range(60):  # bisection: the layer time falls as the fraction rises
        mid = (lo + hi) / 2
        fit = _replace(prior, gemm_fraction=(("bf16", mid),))
        lo, hi = (mid, hi) if layer_s(full, fit) > measured else (lo, mid)
    check = {f"{k}_measured_s": v["fwd_s"] + v["bwd_s"] for k, v in rows.items()}
    check.update({f"{k}_predicted_s": layer_s(v, fit) for k, v in rows.items()})
    s = Summary(source=str(path.resolve()), system=system, model=ModelConfig().name,
                precision="bf16", racks=1, tp=1, pp=1, vp=1, cp=1, minibs=1, step_s=measured,
                compute_s=measured, gemm_share_of_compute=1.0, ffn_share_of_compute=0.0)
    return fit, s, check
