"""The planner's model: calibration reproduced, and the published figures it was NOT fitted to
predicted within the issue's tolerances (predictions, not fits)."""
from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from llama31_405b.config.derived import model_flops_per_sequence
from llama31_405b.config.rules import LLAMA31_405B
from llama31_405b.config.schema import ModelConfig
from llama31_405b.planner import calibrate, compute, convergence, fitted, predict, step
from llama31_405b.planner.calibrate import solver
from llama31_405b.planner.calibrate.solver import config_of
from llama31_405b.planner.context import Context
from llama31_405b.planner.costs import plan
from llama31_405b.planner.pipeline import bubble_fraction, chunk_layers, peak_layer_microbatches
from llama31_405b.planner.spec import layout_problems, make_config
from llama31_405b.planner.sweep import Fixed, sweep

REPO = Path(__file__).resolve().parents[1]
PLANNER = REPO / "llama31_405b" / "planner"
GB200 = "gb200-nvl72"


def published_layout(racks: int, minibs: int, system: str = GB200, **kw):
    return predict(make_config(system, racks, tp=kw.get("tp", 4), pp=8, vp=8, cp=2, minibs=minibs))


def test_planner_imports_no_torch():
    code = ("import sys, llama31_405b.planner as p; p.sweep('gb200-nvl72', 8, p.Fixed(minibs=144)); "
            "import llama31_405b.cli.plan_cmd; "
            "sys.exit(1 if any(m == 'torch' or m.startswith('torch.') for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
    for path in PLANNER.rglob("*.py"):
        assert "import torch" not in path.read_text(), path


def _module(path: Path) -> str:
    """The planner module of a file: `step`, `calibrate` (the sub-package's __init__),
    `calibrate.solver`; the planner's own __init__ is `__init__`."""
    parts = list(path.relative_to(PLANNER).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _planner_imports() -> dict[str, set[str]]:
    """Module -> planner modules it imports (relative imports, at any depth in the file; `from
    .calibrate.constants import X` imports `calibrate.constants`)."""
    files = {_module(p): p for p in PLANNER.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        depth = len(path.relative_to(PLANNER).parts) - 1   # 0: planner/x.py, 1: calibrate/x.py
        pkg = path.relative_to(PLANNER).parts[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not 1 <= node.level <= depth + 1:
                continue
            base = [*pkg[:len(pkg) - (node.level - 1)], *(node.module or "").split(".")]
            base = [b for b in base if b]
            for alias in node.names:
                full = ".".join([*base, alias.name])
                if full in files:
                    deps.add(full)
                    continue
                cut = list(base)
                while cut and ".".join(cut) not in files:
                    cut.pop()
                if cut:
                    deps.add(".".join(cut))
        graph[name] = deps - {name}
    return graph


def test_planner_has_no_import_cycle_and_the_constants_are_passed_in():
    """calibrate/constants.py is data; the model receives the fitted constants as an argument
    and imports only them from the calibrate package: not the package (whose `solve` and
    `fitted` import the solver), not the solver."""
    graph = _planner_imports()
    assert graph["calibrate.constants"] == set()
    assert "calibrate.solver" in graph["calibrate"]
    for low in ("compute", "comm", "costs", "simulate", "step", "memory", "pipeline", "topology",
                "convergence", "context"):
        assert not graph[low] & {"calibrate", "calibrate.solver", "fitting"}, low

    done: set[str] = set()

    def visit(node, path):
        assert node not in path, f"import cycle: {' -> '.join([*path, node])}"
        if node in done:
            return
        for dep in graph.get(node, ()):
            visit(dep, [*path, node])
        done.add(node)

    for mod in graph:
        visit(mod, [])


def test_planner_depends_only_on_config_and_systems():
    """The planner reads the config tree and the systems data, nothing above them (the RCP
    statistics come from config.rcp, not from the submission checker's wrapper), and writes its
    files through `outputs` (layer 0, the standard library only: the one owner of writing a
    result)."""
    for path in PLANNER.rglob("*.py"):
        depth = len(path.relative_to(PLANNER).parts) - 1   # 0: planner/x.py, 1: calibrate/x.py
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= depth + 2:
                assert node.level == depth + 2, (path, node.module)
                assert (node.module or "").split(".")[0] in ("config", "systems", "outputs"), (path, node.module)
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith("llama31_405b."), (path, node.module)


def test_flops_by_part_sum_to_the_project_convention():
    m = ModelConfig()
    parts = compute.flops_by_part(m)
    assert set(parts) == set(compute.PARTS)
    assert sum(parts.values()) == pytest.approx(model_flops_per_sequence(m), rel=1e-12)
    assert sum(parts.values()) == pytest.approx(21_508e12, rel=5e-4)  # the MLPerf convention


def test_calibration_step_is_reproduced_by_the_simulation():
    c = calibrate.CALIBRATION
    p = published_layout(c.racks, c.minibs)
    assert p.simulated
    b = p.breakdown
    assert p.step_time_s == pytest.approx(c.step_s, rel=1e-6)
    # the figures are those of an inner pipeline rank (compute_of = "inner"), with that rank's
    # own slowdown by the overlapped DP collectives (not the busiest rank's: they differ)
    ctx = Context.of(config_of(c, None))
    inner = solver.compared_rank(ctx, c, calibrate.fitted(), b["rank"])
    parts = step.rank_compute(ctx, calibrate.fitted(), inner)
    slow = step.breakdown(ctx, calibrate.fitted(), inner).dp_slowdown_s
    assert abs(slow - b["dp_slowdown_s"]) > 1e-5 * c.compute_s
    comp = sum(parts.values()) + slow
    gemm = sum(parts[k] for k in compute.PARTS)
    ffn = parts["ffn_up"] + parts["ffn_down"]
    assert c.compute_of == "inner" and 0 < inner < ctx.pp - 1
    assert comp == pytest.approx(c.compute_s, rel=1e-6)
    assert gemm / (comp - slow) == pytest.approx(c.gemm_share_of_compute, rel=1e-6)
    assert ffn / (comp - slow) == pytest.approx(c.ffn_share_of_compute, rel=1e-6)
    # the calibration file's [check] sets the inner rank's simulated compute beside the measured
    checked = calibrate.check(c, calibrate.fitted())
    assert checked["simulated_compute_s"] == pytest.approx(c.compute_s, rel=1e-6)
    # the last rank, with the LM head in BF16 under NVFP4 (compute.part_precision), is busier
    assert b["rank"] == ctx.pp - 1 and b["compute_total_s"] > c.compute_s
    parts = ("compute_total_s", "tp_s", "cp_s", "pp_s", "bubble_s", "dp_s", "optimizer_s")
    assert sum(b[k] for k in parts) == pytest.approx(p.step_time_s, rel=1e-9)
    assert b["dp_slowdown_s"] > 0  # the DP collectives overlap compute and slow it


def test_breakdown_and_calibration_describe_a_gpu_with_a_full_share_of_layers():
    """The published compute (733 ms) is calibrated on a GPU holding a full share of the layers
    (16 of the 128 slots at PP8-VP8) and neither the embedding nor the LM head, whichever rank
    finishes last. With BF16 gradients the first pipeline rank (15 layers + embedding) once
    finished last; calibrating on it made every layer 16/15 slower and the MFU at DP 8 7% low.
    With the LM head in BF16 the last rank (15 layers + LM head) finishes last; calibrating on
    it left the attention 1 ms of the 74 % GEMM share (a fraction 40 of its peak)."""
    c = calibrate.CALIBRATION
    cfg = make_config(GB200, c.racks, tp=c.tp, pp=c.pp, vp=c.vp, cp=c.cp, minibs=c.minibs)
    ctx = Context.of(cfg)
    b = predict(cfg).breakdown
    layers = [sum(chunk_layers(ctx, r, ch) for ch in range(ctx.vp)) for r in range(ctx.pp)]
    inner = solver.compared_rank(ctx, c, calibrate.fitted(), b["rank"])
    assert layers[inner] == max(layers) == 16 and min(layers) == 15
    assert layers[b["rank"]] == 15
    f = calibrate.fitted()
    assert 0.2 < f.attention_bf16_fraction < 1
    busiest = calibrate.solve(replace(c, compute_of="busiest"))
    assert busiest.attention_bf16_fraction > 10   # no kernel runs at 10x its peak


def test_weights_are_cast_once_per_step_in_each_chunks_first_forward():
    """BF16 parameters gathered (the shipped GB200 configs) and NVFP4 GEMMs: Transformer Engine
    quantizes each weight at the step's first microbatch (amax pass, then row- and column-wise
    NVFP4 copies); with NVFP4 parameters gathered only the transposed copy is derived; BF16
    GEMMs cast nothing."""
    def first_fwd(cfg):
        ctx = Context.of(cfg)
        ch = plan(ctx, fitted()).chunks[1][0]
        return ch.first_fwd_s * ctx.system.hbm_tbs * 1e12 * calibrate.ASSUMED.hbm_stream_efficiency / ch.params

    base = make_config(GB200, 128, tp=4, pp=8, vp=8, cp=2, minibs=8)
    assert not base.performance.fp4_param_gather
    assert first_fwd(base) == pytest.approx(2 * 2.0 + 2 * 0.5625)
    fp4 = replace(base, performance=replace(base.performance, fp4_param_gather=True))
    assert first_fwd(fp4) == pytest.approx(2 * 0.5625)
    bf16 = make_config(GB200, 128, tp=4, pp=8, vp=8, cp=2, minibs=8, precision="bf16")
    assert first_fwd(bf16) == 0


def test_embedding_and_output_layer_are_neither_cast_nor_gathered_in_nvfp4():
    """Only the transformer layers' weights are quantized (megatron-core 0.19.2 builds them under
    the quantized-init context layer by layer; the embedding and the output layer stay BF16):
    the first and last pipeline ranks' chunks cast their layers alone, and with the NVFP4
    parameter gather gather the embedding and LM head parameters in BF16."""
    from llama31_405b.planner import comm
    base = make_config(GB200, 128, tp=4, pp=8, vp=8, cp=2, minibs=8)
    fp4 = replace(base, performance=replace(base.performance, fp4_param_gather=True))
    for cfg, cast in ((base, 2 * 2.0 + 2 * 0.5625), (fp4, 2 * 0.5625)):
        ctx = Context.of(cfg)
        p = plan(ctx, fitted())
        eff = ctx.system.hbm_tbs * 1e12 * calibrate.ASSUMED.hbm_stream_efficiency
        for ch, emb, logits in ((p.chunks[0][0], True, False), (p.chunks[-1][-1], False, True)):
            layers = (ch.params - (emb + logits) * ctx.vocab * ctx.model.hidden_size / ctx.tp
                      - (ctx.model.hidden_size if logits else 0))
            assert 0 < layers < 0.9 * ch.params    # the vocabulary's share is a quarter or more
            assert ch.first_fwd_s * eff == pytest.approx(layers * cast)
            high = ch.params - layers
            low = comm.param_gather_bytes_per_param(ctx)
            both = comm.dp_gather_s(ctx, ch.params, fitted(), ch.buckets, high_params=high)
            alike = comm.dp_gather_s(ctx, ch.params, fitted(), ch.buckets)
            assert ch.gather_s == pytest.approx(both)
            assert (both > alike) if low < 2 else (both == pytest.approx(alike))


def test_dp_contention_uses_the_shipped_communicator_ctas():
    """The SMs a DP collective takes from compute are the CTAs the shipped configs allow the
    distributed optimizer's communicators (dp, dp_cp)."""
    import yaml
    base = (REPO / "configs" / "base" / "gb200_405b.toml").read_text()
    path = REPO / "configs" / "nccl" / "gb200_communicators.yaml"
    assert f'nccl_communicator_config = "nccl/{path.name}"' in base
    comms = yaml.safe_load(path.read_text())
    assert calibrate.ASSUMED.nccl_dp_ctas == comms["dp"]["max_ctas"] == comms["dp_cp"]["max_ctas"]


def test_fitted_constants_are_physical():
    f = fitted()
    assert 0.2 < f.nvfp4_gemm_peak_fraction < 1
    assert 0.2 < f.attention_bf16_fraction < 1
    assert 0.1 < f.nvlink_bus_efficiency < 1
    assert f.elementwise_passes > 1


def test_mfu_at_dp8_gbs1152_predicted_within_5_percent():
    p = published_layout(8, 144)
    assert (p.dp, p.gbs) == (8, 1152)
    assert p.fits
    assert abs(p.mfu / 0.2645 - 1) < 0.05, p.mfu


def test_dp8_sweep_ranks_published_layout_first():
    """At DP 8 / GBS 1152 the best layout that fits is TP4-PP8-CP2 (the published choice). The
    PP16 layouts that trade CP for pipeline depth hold twice the activations and do not fit once
    the allocator's fragmentation on them is counted."""
    ranked = [p for p in sweep(GB200, 8, Fixed(minibs=144)) if p.fits and p.dp == 8]
    assert len(ranked) > 5 and all(p.gbs == 1152 for p in ranked)
    assert ranked[0].simulated
    assert (ranked[0].tp, ranked[0].pp, ranked[0].cp) == (4, 8, 2)
    pp16 = predict(make_config(GB200, 8, tp=4, pp=16, vp=8, cp=1, minibs=144))
    assert not pp16.fits and "fragmentation" in pp16.why_not
    assert pp16.memory["activations_gb"] > 2 * ranked[0].memory["activations_gb"] * 0.95


def test_memory_counts_fragmentation_on_activations_only():
    p = published_layout(8, 144)
    m = p.memory
    assert m["fragmentation_gb"] == pytest.approx(m["activations_gb"] * calibrate.ASSUMED.activation_fragmentation)
    parts = ("weights_gb", "grads_gb", "optimizer_gb", "activations_gb", "fragmentation_gb", "reserved_gb")
    assert p.memory_per_gpu_gb == pytest.approx(sum(m[k] for k in parts))


@pytest.mark.parametrize("racks,minibs,published", [(128, 8, 7.07), (40, 24, 18.79)])
def test_time_to_train_predicted_within_the_convergence_spread(racks, minibs, published):
    """Within 10%, and the published score inside the band one standard deviation of the
    reference runs' samples to converge spans (the convergence spread of the RCP data)."""
    p = published_layout(racks, minibs)
    assert p.fits
    assert abs(p.time_to_train_min / published - 1) < 0.10, p.time_to_train_min
    lo, hi = p.time_to_train_range_min
    assert lo <= p.time_to_train_min <= hi
    assert lo <= published <= hi, (lo, hi)


def test_time_to_train_adds_the_first_step_and_the_checker_scaling():
    p = published_layout(40, 24)  # GBS 960: below the smallest RCP
    a = calibrate.ASSUMED
    raw = p.steps * p.step_time_s + a.first_step_extra_s + p.evaluations * p.eval_time_s + a.run_overhead_s
    assert p.score_scale > 1
    assert p.time_to_train_min * 60 == pytest.approx(raw * p.score_scale)


def test_tp2_pp8_cp2_minibs8_fits_gb300_not_gb200():
    gb200 = published_layout(128, 8, tp=2)
    gb300 = published_layout(128, 8, system="gb300-nvl72", tp=2)
    assert not layout_problems(make_config("gb300-nvl72", 128, tp=2, pp=8, vp=8, cp=2, minibs=8))
    assert not gb200.fits and "GB" in gb200.why_not and "grads" in gb200.why_not
    assert gb300.fits, gb300.why_not
    assert gb200.memory_per_gpu_gb == pytest.approx(gb300.memory_per_gpu_gb)


@pytest.mark.parametrize("gbs,steps,evals", [(1152, 272, 3), (1024, 306, 3), (960, 320, 2), (2304, 160, 3)])
def test_convergence_snaps_to_the_eval_schedule(gbs, steps, evals):
    s = convergence.schedule(LLAMA31_405B, gbs)
    assert (s.steps, s.evaluations) == (steps, evals)
    assert s.steps >= s.samples_to_converge / gbs
    assert (s.steps - s.first_eval_step) % s.eval_interval_steps == 0


def test_samples_to_converge_follow_the_rulesets_rcps():
    """The RCP data are mlperf_logging's (olympic means): interpolated between RCPs, the trend
    of the two smallest extended below 1152, where the checker scales a faster run's score up to
    the 1152 mean; NVFP4 is a separate factor."""
    pts = convergence.rcp_points()
    assert {p.gbs for p in pts} == set(LLAMA31_405B.rcp_gbs)
    assert [p.mean for p in pts] == [313_344, 368_640, 493_056]
    assert pts[0].stdev == pytest.approx(10_642, abs=1)
    assert convergence.samples_to_converge(2304) == 368_640
    assert convergence.samples_to_converge(3456) == pytest.approx((368_640 + 493_056) / 2)
    slope = (368_640 - 313_344) / (2304 - 1152)
    assert convergence.samples_to_converge(960) == pytest.approx(313_344 - slope * 192)
    assert convergence.samples_to_converge(512) < convergence.samples_to_converge(1024) < 313_344
    s = convergence.schedule(LLAMA31_405B, 960)
    assert s.samples == 307_200 and s.score_scale == pytest.approx(313_344 / 307_200)
    assert convergence.schedule(LLAMA31_405B, 1152).score_scale == 1.0
    assert convergence.samples_to_converge(1152, "nvfp4") == pytest.approx(
        313_344 * calibrate.ASSUMED.nvfp4_samples_factor)
    with pytest.raises(ValueError, match="4608"):
        convergence.samples_to_converge(4616)


def test_pipeline_bubble_and_activations_in_flight():
    def ctx(minibs, vp=8, pp=8):
        return Context.of(make_config(GB200, 8, tp=4, pp=pp, vp=vp, cp=2, minibs=minibs))
    assert bubble_fraction(ctx(8)) == pytest.approx(7 / 64)
    assert bubble_fraction(ctx(16, vp=1)) == pytest.approx(7 / 16)
    # m == PP: all 64 chunk forwards before the first backward; rank 1 holds 8 x 8 x 2 layers
    assert peak_layer_microbatches(ctx(8)) == 128
    # steady state: rank 1 warms up (8-2)*2 + 7*8 + 1 = 69 chunks of 2 layers
    assert peak_layer_microbatches(ctx(144)) == 138
    assert peak_layer_microbatches(ctx(144, vp=1)) == 8 * 15  # rank 0: 8 in flight x 15 layers


def test_sweep_is_ranked_and_every_candidate_passes_the_validator():
    ranked = sweep(GB200, 16)
    fits = [p for p in ranked if p.fits]
    assert fits and all(p.fits for p in ranked[:len(fits)])
    sim = [p for p in fits if p.simulated]
    est = [p for p in fits if not p.simulated]
    assert sim and fits[:len(sim)] == sim  # the simulated candidates lead
    for group in (sim, est):
        ttt = [p.time_to_train_min for p in group]
        assert ttt == sorted(ttt)
    for p in ranked[:: max(1, len(ranked) // 25)]:
        cfg = make_config(GB200, 16, tp=p.tp, pp=p.pp, vp=p.vp, cp=p.cp, minibs=p.minibs)
        assert layout_problems(cfg) == []
        assert p.gbs <= LLAMA31_405B.max_gbs and p.minibs % p.pp == 0


def test_other_systems_predict():
    h100 = sweep("h100-sxm", 64)  # 64 nodes of 8 GPUs
    assert h100 and h100[0].precision == "fp8" and h100[0].fits
    assert all(8 % p.tp == 0 for p in h100)  # TP inside a node
    assert all(p.tp * p.pp * p.cp > 8 for p in h100 if p.fits)  # 405B: pipelines span nodes
    gb300 = published_layout(128, 8, system="gb300-nvl72")
    assert gb300.step_time_s < published_layout(128, 8).step_time_s  # 1.5x NVFP4 peak


def test_activations_on_the_wire_take_the_parameters_bytes():
    """TP's collectives and the pipeline's sends carry activations in the parameters' dtype (the
    model builder's `params_dtype` and `pipeline_dtype`): the CPU's FP32 tiny runs send twice
    the bytes of a BF16 run of the same shape (model revision 17); the GPU configs stay BF16."""
    from llama31_405b.config.load import load_config
    from llama31_405b.planner import comm
    fp32 = load_config(REPO / "configs" / "tiny_cpu.toml")
    bf16 = replace(fp32, precision=replace(fp32.precision, params="bf16"))
    a, b = Context.of(fp32), Context.of(bf16)
    assert comm.act_bytes(a) == 4.0 and comm.act_bytes(b) == 2.0
    assert comm.tp_bytes(a) == 2 * comm.tp_bytes(b) == a.tokens * a.model.hidden_size * 4.0
    assert comm.p2p_bytes(a) == 2 * comm.p2p_bytes(b)
    gpu = Context.of(make_config(GB200, 128, tp=4, pp=8, vp=8, cp=2, minibs=8))
    assert gpu.cfg.precision.params == "bf16" and comm.act_bytes(gpu) == comm.ACT_BYTES == 2.0
