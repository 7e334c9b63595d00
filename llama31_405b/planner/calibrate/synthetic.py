"""A synthetic profile folder: the planner's own prediction written as `profile` writes a
measurement, what the calibration's round trip is tested on (tests/test_planner_calibrate*.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .read_profile import REPLAYED


@dataclass(frozen=True)
class Eager:
    """What the eager steps of a graphed run add to its replayed step (`synthetic_profile` of a
    graphed run): the host gaps of the launches a replay does not make, waits in collectives by
    kind (KINDS), and the activations they allocate outside the captured graph's pool."""
    host_s: float = 0.0
    exposed: tuple[tuple[str, float], ...] = ()
    activations_gb: float = 0.0


EXPOSED = {"TP": "TP exposed", "CP": "CP exposed", "PP": "PP exposed (incl. bubble)",
           "DP": "DP exposed"}


def synthetic_profile(folder: str | Path, cfg, fit, with_memory: bool = False,
                      eager: Eager | None = None) -> Path:
    """Write a profile folder of the planner's own prediction for `cfg` with the constants
    `fit` (profile.json and analysis.json, the rows `profile` writes, the DP replicas' waiting
    for the slowest among the waits for peers; with `with_memory`, rank
    0's record with the allocator peaks the memory model predicts, as a GPU profile has them).
    With `eager`, the profile of a run with full-iteration CUDA graphs whose replayed step is the
    prediction: its trace (analysis.json) holds eager steps, longer by what `eager` adds, and
    rank 0's record the replayed and eager timings (profile/capture.py) and the peaks read after
    the replayed steps (those after the eager ones higher by `eager.activations_gb`). It holds
    no trace: not an MLPerf run, and nothing to re-analyse."""
    from ..context import Context
    from ..memory import memory
    from ..step import breakdown
    from .solver import _modelled
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=False)
    ctx = Context.of(cfg)
    b = breakdown(ctx, fit)
    comp = {f"compute_{k}_s": v for k, v in b.compute_s.items()}
    values = {"GEMM QKV": comp["compute_qkv_s"], "attention core": comp["compute_attention_s"],
              "GEMM attention out proj": comp["compute_proj_s"],
              "GEMM FFN up/gate": comp["compute_ffn_up_s"], "GEMM FFN down": comp["compute_ffn_down_s"],
              "GEMM LM head": comp["compute_logits_s"], "other compute": comp["compute_elementwise_s"],
              "optimizer": b.optimizer_s, "TP exposed": b.tp_s, "CP exposed": b.cp_s,
              "PP exposed (incl. bubble)": b.pp_s + b.bubble_s, "DP exposed": b.dp_exposed_s,
              "other comm exposed": 0.0, "host gaps": b.host_s}
    # the replicas' waiting for the slowest is in the DP collectives' time, as a trace shows it
    step, dp_total = b.step_s, _modelled(ctx, fit, b, "DP") + b.dp_peer_wait_s
    if eager is not None:
        extra = dict(eager.exposed)
        for k, v in extra.items():
            values[EXPOSED[k]] += v
        values["host gaps"] += eager.host_s
        step += eager.host_s + sum(extra.values())
        dp_total += extra.get("DP", 0.0)
    lay = cfg.parallel
    (folder / "profile.json").write_text(json.dumps({
        "kind": "synthetic profile written by the planner (not a measurement)", "mlperf_run": False,
        "config": cfg.source, "system": cfg.system.id, "model": cfg.model.name,
        "precision": cfg.precision.compute, "dp_overlap": cfg.performance.dp_overlap(),
        "layout": {"tp": lay.tp, "pp": lay.pp, "vp": lay.vp or 1, "cp": lay.cp, "dp": cfg.derived.dp}},
        indent=1))
    (folder / "analysis.json").write_text(json.dumps({
        "measured_step_s": step, "compared_ranks": [0],
        "comparison": [{"component": k, "measured_s": v} for k, v in values.items()],
        "ranks": {"0": {"comm": {"DP": {"role": "DP", "total_s": dp_total}}}}}
        | ({"waiting_for_peers": {"DP": b.dp_peer_wait_s}} if b.dp_peer_wait_s else {}),
        indent=1))
    rec: dict = {"rank": 0}
    if eager is not None:
        rec.update(cuda_graphs=True, baseline_step_s=[b.step_s] * 3, eager_step_s=[step] * 3)
    if with_memory:
        mem = memory(ctx, fit)
        alloc = mem.total_gb - mem.fragmentation_gb - mem.reserved_gb
        rec["memory"] = {"max_allocated_gb": alloc, "max_reserved_gb": alloc + mem.fragmentation_gb,
                         "capacity_gb": mem.capacity_gb}
        if eager is not None:
            more = eager.activations_gb
            rec.update(memory_at=REPLAYED, memory_eager={
                "max_allocated_gb": alloc + more,
                "max_reserved_gb": alloc + mem.fragmentation_gb + more,
                "capacity_gb": mem.capacity_gb})
    if len(rec) > 1:
        (folder / "ranks").mkdir()
        (folder / "ranks" / "rank00000.json").write_text(json.dumps(rec, indent=1))
    return folder
