"""The rehearsal's verdict and its text report (pure functions of the report dict of run.py).

Per rank, the bytes one GPU holds: weights, gradients, master weights and optimizer state as
Megatron's buffers hold them, TE's quantized weight copies computed from the rank's linear layers,
and, from the planner (labelled so), activations, allocator fragmentation and the reserve.
On GPU systems their sum must fit the GPU's memory (CPU systems: reported, not checked: the
planner's reserve is a GPU's). Beside each, the planner's prediction for the rank's
pipeline stage; weights, gradients and optimizer state must agree within PLANNER_TOLERANCE.
"""
from __future__ import annotations

PLANNER_TOLERANCE = 0.05
GB = 1e9
EXIT_FAIL, EXIT_CONFIG, EXIT_PLACEMENT = 1, 2, 3

ROWS = (  # (label, rehearsal key, planner key, source of the rehearsal figure)
    ("weights", "weights", "weights", "DDP param buffers"),
    ("gradients", "grads", "grads", "DDP grad buffers"),
    ("master weights", "master_weights", None, "dist. optimizer FP32 shards"),
    ("optimizer state", "optimizer_state", None, "Adam exp_avg + exp_avg_sq"),
    ("optimizer total", "optimizer", "optimizer", "master + state"),
    ("TE weight copies", "te_copies", "te_copies",
     "computed: linear weights, rowwise + columnwise NVFP4/FP8"),
)
PLANNER_ONLY = (("activations", "activations", "planner, fullest rank"),
                ("fragmentation", "fragmentation", "planner"),
                ("reserved", "reserved", "planner"))
CHECKED = ("weights", "grads", "optimizer")


def rank_bytes(res: dict) -> dict[str, float]:
    b = dict(res.get("bytes") or {})
    if b:
        b["optimizer"] = b["master_weights"] + b["optimizer_state"]
    return b


def rank_total(res: dict) -> float:
    """Bytes one GPU of this rank needs: Megatron's buffers + the computed TE copies + the
    planner's activations, fragmentation and reserve (and the planner's weights where the run's
    parameters are TE's FP8/NVFP4 tensors, which the local spec builds in BF16)."""
    b, pl = rank_bytes(res), res["planner"]
    weights = pl["weights"] if res.get("quantized_params") else b["weights"]
    return (weights + b["grads"] + b["optimizer"] + b["te_copies"]
            + pl["activations"] + pl["fragmentation"] + pl["reserved"])


def planner_differences(res: dict) -> list[str]:
    """Checked categories where the planner is more than PLANNER_TOLERANCE off."""
    b, pl, out = rank_bytes(res), res["planner"], []
    for key in CHECKED:
        if key == "weights" and res.get("quantized_params"):
            continue       # BF16 here, FP8/NVFP4 tensors in the run: nothing to compare
        if b.get(key):
            dev = (pl[key] - b[key]) / b[key]
            if abs(dev) > PLANNER_TOLERANCE:
                out.append(f"rank {res['rank']}: planner {key} {pl[key] / GB:.2f} GB vs Megatron's "
                           f"{b[key] / GB:.2f} GB ({dev:+.1%})")
    return out


def verdict(rep: dict) -> dict:
    """{"ok", "exit_code", "failures", "planner_check"} of a report."""
    fails: list[str] = []
    placed = rep.get("placement", {"ok": True})
    placement = not placed["ok"]
    if placement:
        first = [x.strip() for x in placed["error"].splitlines()[:2]]
        fails.append("placement: " + " ".join(first))
    ds = rep.get("dataset") or {}
    if not ds.get("ok"):
        fails.append(f"dataset: {ds.get('error') or '; '.join(ds.get('problems', []))}")
    if ds.get("total_bytes", 0) > rep["max_index_bytes"]:
        fails.append(f"dataset index {ds['total_bytes'] / GB:.1f} GB exceeds --max-index-gb "
                     f"{rep['max_index_bytes'] / GB:g} ({rep['steps']:,} steps x GBS "
                     f"{rep['gbs']} = {ds['samples']:,} samples): lower run.max_steps")
    if not rep["precheck"]["ok"]:
        fails += [f"precheck: {e}" for e in rep["precheck"]["errors"]]
    checks = []
    for res in rep["ranks"]:
        if not res.get("ok"):
            placement |= bool(res.get("placement_failed"))
            fails.append(f"rank {res['rank']}: {res.get('phase', '?')} failed: "
                         f"{res.get('error', 'no result')}")
            continue
        total = rank_total(res)
        if rep.get("gpu_system", True) and total > rep["capacity_bytes"]:
            fails.append(f"rank {res['rank']}: needs {total / GB:.0f} GB of "
                         f"{rep['capacity_bytes'] / GB:.0f} GB per GPU (stage "
                         f"{res['planner']['stage']}): the layout does not fit in memory")
        checks += planner_differences(res)
    code = 0 if not fails else EXIT_PLACEMENT if placement else EXIT_FAIL
    return {"ok": not fails, "exit_code": code, "failures": fails, "planner_check": checks}


def _gb(x) -> str:
    return "-" if x is None else f"{x / GB:8.2f} GB"


def _layers(res: dict) -> str:
    parts, count = [], 0
    for c in res.get("layers", []):
        lo_hi = c["layers"]
        text = ("" if not lo_hi else f"L{lo_hi[0]}" if lo_hi[0] == lo_hi[1]
                else f"L{lo_hi[0]}-{lo_hi[1]}")
        held = ["emb"] * c["embedding"] + ([text] if text else []) + ["out+loss"] * c["output"]
        parts.append("+".join(held))
        count += c["count"]
    return f"{count} layers in {len(parts)} chunk(s): {', '.join(parts)}"


def _nccl(n: dict) -> str:
    """The NCCL options Megatron derived from the config's communicator YAML."""
    if not n.get("options") and not n.get("unused"):
        return ""
    opts = ", ".join(f"{k} cga {o['cga_cluster_size']} ctas {o['min_ctas']}-{o['max_ctas']}"
                     for k, o in n["options"].items())
    unused = f"; YAML entries no group asked for: {', '.join(n['unused'])}" if n["unused"] else ""
    return f"\n  NCCL options from the communicator YAML: {opts or 'none'}{unused}"


def format_rank(res: dict, capacity: float, gpu: bool = True) -> list[str]:
    c = res.get("coords", {})
    head = (f"rank {res['rank']} (tp{c.get('tp')} cp{c.get('cp')} pp{c.get('pp')} "
            f"dp{c.get('dp')}, host {res.get('host', '?')}, planner stage "
            f"{res['planner']['stage']})")
    if not res.get("ok"):
        return [head + f": FAILED in {res.get('phase', '?')}: {res.get('error', 'no result')}"]
    out = [head, f"  holds {_layers(res)}",
           "  groups: " + ", ".join(f"{k} {v}" for k, v in res["groups"].items() if v)
           + _nccl(res.get("nccl") or {}),
           "  init: " + ", ".join(f"{k} {v:.1f} s" for k, v in res["phases"].items())
           + f" (process {res['wall_s']:.0f} s, peak RSS {res['peak_rss'] / GB:.2f} GB)",
           f"  {'bytes per GPU':<18}{'rehearsal':>12}  {'planner':>11}  diff    source"]
    b, pl = rank_bytes(res), res["planner"]
    for label, key, pkey, src in ROWS:
        p = pl.get(pkey) if pkey else None
        if key == "weights" and res.get("quantized_params"):
            src += (f" (BF16 here; the run's parameters are {res['quantized_params'].upper()}: "
                    "the total takes the planner's)")
        diff = f"{(p - b[key]) / b[key]:+6.1%}" if p is not None and b.get(key) else "      "
        out.append(f"  {label:<18}{_gb(b.get(key)):>12}  {_gb(p):>11}  {diff}  {src}")
    for label, key, src in PLANNER_ONLY:
        out.append(f"  {label:<18}{'-':>12}  {_gb(pl[key]):>11}          {src}")
    out.append(f"  {'total':<18}{_gb(rank_total(res)):>12}  of {capacity / GB:.0f} GB"
               + ("" if gpu else " (CPU system: the planner's GPU reserve; not checked)"))
    rd, rt = res.get("checkpoint_read"), res.get("checkpoint_read_tp_chunks")
    if rd:
        out.append(f"  initial checkpoint read: {rd['after_bytes'] / GB:.2f} GB, once, its "
                   f"share of the {rd['slice_bytes'] / GB:.2f} GB slice over a DP x CP group of "
                   f"{rd['group_size']} (before the parallel load: "
                   f"{rd['before_bytes'] / GB:.2f} GB, the slice at init and again at the "
                   "warm-up restore)" + ("" if not rt else
                   f"; converted in the chunks of TP{rt['chunk_tp']}: "
                   f"{rt['after_bytes'] / GB:.2f} GB of a {rt['slice_bytes'] / GB:.2f} GB slice"))
    return out


def format_checkpoint_totals(t: dict | None) -> str:
    if not t:
        return ("initial checkpoint read, whole job: not computed (play a rank of every "
                "pipeline stage)")
    if t.get("chunk_tp", 1) != 1:
        return (f"initial checkpoint read, whole job, converted in the chunks of "
                f"TP{t['chunk_tp']} (the default): {t['after_bytes'] / 1e12:.2f} TB "
                f"(checkpoint {t['checkpoint_bytes'] / 1e12:.2f} TB, each chunk read by one "
                "TP rank's groups; the norms by every TP rank's)")
    return (f"initial checkpoint read, whole job, converted in whole layers (--chunks-tp 1): "
            f"{t['after_bytes'] / 1e12:.2f} TB "
            f"(checkpoint {t['checkpoint_bytes'] / 1e12:.2f} TB, read whole by each TP rank's "
            f"groups); before the parallel load {t['before_bytes'] / 1e12:.1f} TB "
            "(every rank its slice, twice)")


def format_idx_share(f: dict) -> str:
    """The training .idx files at init (data/index_share.py, rehearse/dataset.idx_footprint)."""
    return (f"  .idx at init, per node of {f['ranks_per_node']} ranks: "
            f"{f['read_bytes'] / GB:.2f} GB read from the data file system, "
            f"{f['memory_bytes'] / GB:.2f} GB of host memory (one read-only copy in shared "
            f"memory of what a read needs; before, a private copy of the whole .idx per rank: "
            f"{f['read_before_bytes'] / GB:.2f} GB read, {f['memory_before_bytes'] / GB:.2f} GB "
            f"held); whole job ({f['nodes']:,} nodes): {f['job_read_bytes'] / 1e12:.2f} TB read "
            f"(before: {f['job_read_before_bytes'] / 1e12:.2f} TB)")


def format_text(rep: dict) -> str:
    ds = rep.get("dataset") or {}
    lines = [f"rehearsal of {rep['config']}: world {rep['world_size']} ({rep['layout']}), "
             f"{rep['allocation']}, {len(rep['ranks'])} rank(s) played in "
             f"{rep['wall_s']:.0f} s"]
    placed = rep.get("placement") or {}
    if placed:
        lines.append(f"placement: the placement check passes ({placed['racks']} NVLink "
                     "domain(s))" if placed["ok"] else f"placement: FAILED: {placed['error']}")
    if ds.get("datasets"):
        per = "; ".join(f"{d['prefix'].rsplit('/', 1)[-1]}: {d['documents']:,} docs, "
                        f"{d['tokens'] / 1e9:.1f} B tokens ({d['source']}), "
                        f"{d['epochs']} epoch(s), "
                        f"{d['total_bytes'] / GB:.2f} GB" for d in ds["datasets"])
        build = (f"build {ds['build_s']:.0f} s ({ds['build_how']})"
                 if ds.get("build_s") is not None else ds.get("build_how", ""))
        lines.append(f"dataset: {ds['samples']:,} samples requested ({rep['steps']} steps x GBS "
                     f"{rep['gbs']}); index {ds['total_bytes'] / GB:.2f} GB of "
                     f"{rep['max_index_bytes'] / GB:g} allowed; {build}; rank 0 peak "
                     f"~{ds['peak_build_bytes'] / GB:.1f} GB")
        lines.append(f"  {per}")
        if ds.get("idx_share"):
            lines.append(format_idx_share(ds["idx_share"]))
    elif ds.get("skipped"):
        lines.append("dataset: skipped")
    elif ds:
        lines.append(f"dataset: FAILED: {ds.get('error') or '; '.join(ds.get('problems', []))}")
    header = {e["key"]: e["value"] for e in rep["header"]}
    lines.append(f"MLPerf header: {len(rep['header'])} events "
                 f"(GBS {header.get('global_batch_size')}"
                 f", lr {header.get('opt_base_learning_rate')}, train_samples "
                 f"{header.get('train_samples')}, max_steps {header.get('max_steps')}); "
                 f"precheck {'PASS' if rep['precheck']['ok'] else 'FAIL'}")
    for res in rep["ranks"]:
        lines += format_rank(res, rep["capacity_bytes"], rep.get("gpu_system", True))
    first = next((r for r in rep["ranks"] if r.get("ok")), None)
    if first is not None:
        changed = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in first["config_changes"].items())
        gpu = ", ".join(f"{k}={v}" for k, v in first["gpu_only_fields"].items())
        lines.append("built with Megatron's local spec on the meta device: "
                     f"{changed or 'no change'}"
                     f" (same parameter shapes); GPU-only fields not built: {gpu or 'none'}")
        lines.append("Transformer Engine's spec differs by: the RMSNorm weights fused into "
                     "linear_qkv and linear_fc1 (same bytes), no attention parameters either way, "
                     "and the quantized weight copies (the 'TE weight copies' row, not built here)")
    if "checkpoint_read" in rep:
        lines.append(format_checkpoint_totals(rep["checkpoint_read"]))
    if rep.get("checkpoint_read_tp_chunks"):
        lines.append(format_checkpoint_totals(rep["checkpoint_read_tp_chunks"]))
    lines.append("planner check (weights, gradients, optimizer within "
                 f"{PLANNER_TOLERANCE:.0%}): " + ("ok" if not rep["planner_check"]
                                                   else "; ".join(rep["planner_check"])))
    if rep["ok"]:
        lines.append(f"verdict: PASS: {len(rep['ranks'])} rank(s) of {rep['world_size']} set up, "
                     "placed, built and fit in memory; index within bound; precheck passes")
    else:
        lines.append("verdict: FAIL: " + " | ".join(rep["failures"]))
    return "\n".join(lines)
