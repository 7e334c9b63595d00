"""A compute part's time per layer pass that does not grow with its work (`Fitted.call_s`;
issue 46, point 2): on the CPU, TP2's GEMMs, attention and elementwise kernels, half the size of
DP2's in twice the passes, take 1.3-1.7x DP2's time for the same work per rank (the proof runs
of 2026-12-05, docs/planner.md), which a rate per FLOP alone cannot describe. Two layouts whose
ranks each have a core and whose passes differ in size separate the time per pass from the rate
(calibrate/joint.py `_call_times`). The round trip: synthetic profiles the planner writes of its
own prediction with known constants (the time per pass among them) give them back and predict a
layout that was not fitted (PP2) as the known constants do. The elementwise work's time per pass
comes from layouts without TP alone (model revision 14; TP's passes add their own)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from llama31_405b.cli import main
from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, compute, predict
from llama31_405b.planner.context import Context
from llama31_405b.planner.step import breakdown, busiest_rank, rank_compute
from llama31_405b.planner.calibrate.synthetic import synthetic_profile

from test_planner_core_share import config

CALLS = (("attention", 0.0007), ("elementwise", 0.0012), ("ffn", 0.0004), ("logits", 0.0009),
         ("proj", 0.0002), ("qkv", 0.0003))
KNOWN = dict(attention_bf16_fraction=0.09, elementwise_passes=31.0, host_s_per_layer_pass=0.004,
             gemm_fraction=(("fp32", 0.3),), collective_latency_s=0.005,
             nvlink_bus_efficiency=0.2, call_s=CALLS)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """TP2, DP2 and PP2 on 2 ranks (the same work per rank), synthetic profiles of the first two
    with the known constants."""
    tmp = tmp_path_factory.mktemp("calls")
    fit = replace(calibrate.fitted(), **KNOWN)
    paths = {"tp2": config(tmp, "tp2", 2, 2, 1, 4), "dp2": config(tmp, "dp2", 2, 1, 1, 2),
             "pp2": config(tmp, "pp2", 2, 1, 2, 4)}
    cfgs = {k: load_config(v) for k, v in paths.items()}
    folders = {k: synthetic_profile(tmp / f"profile_{k}", cfgs[k], fit) for k in ("tp2", "dp2")}
    return fit, paths, cfgs, folders


def test_the_time_per_pass_counts_once_per_layer_and_microbatch(layouts):
    """TP2 runs twice DP2's layer passes for the same work: the time per pass adds twice as
    much to it; the FFN's is split over its two GEMMs, the LM head's counted per microbatch."""
    fit, _, cfgs, _ = layouts
    added = {}
    for name in ("tp2", "dp2"):
        ctx = Context.of(cfgs[name])
        rank = busiest_rank(ctx, fit)
        with_, without = (rank_compute(ctx, f, rank) for f in (fit, replace(fit, call_s=())))
        added[name] = {k: with_[k] - without[k] for k in with_}
    layers, mbs = cfgs["dp2"].model.num_layers, cfgs["dp2"].derived.num_microbatches
    calls = dict(CALLS)
    assert added["dp2"]["qkv"] == pytest.approx(layers * mbs * calls["qkv"])
    assert added["dp2"]["ffn_up"] == pytest.approx(layers * mbs * calls["ffn"] / 2)
    assert added["dp2"]["logits"] == pytest.approx(mbs * calls["logits"])
    for k in ("qkv", "attention", "proj", "ffn_up", "ffn_down", "logits", "elementwise"):
        assert added["tp2"][k] == pytest.approx(2 * added["dp2"][k]), k
    assert {p for p, _ in CALLS} == set(compute.CALL_PARTS)


def test_tp2_and_dp2_fit_the_time_per_pass_and_predict_pp2(layouts):
    """The GEMMs' and the attention's time per pass come back; the elementwise work's is not
    read from TP2 against DP2 (model revision 14): DP2's passes give its rate (their time per
    pass in it), what TP2's passes take beyond that is TP's own (`compute.ELEMENTWISE_TP`).
    PP2's passes are DP2's size, so its step is still the known constants'."""
    fit, _, cfgs, folders = layouts
    runs = [(calibrate.from_profile(folders[k], cfgs[k]), cfgs[k]) for k in ("tp2", "dp2")]
    got = calibrate.solve_joint(runs)
    calls = dict(got.call_s)
    for part, seconds in CALLS:
        if part != "elementwise":
            assert calls[part] == pytest.approx(seconds, rel=1e-4), part
    assert calls["elementwise"] == 0.0 and calls[compute.ELEMENTWISE_TP] > 0
    assert got.elementwise_passes > fit.elementwise_passes    # DP2's time per pass in its rate
    assert dict(got.gemm_fraction)["fp32"] == pytest.approx(0.3, rel=1e-4)
    for name in ("attention_bf16_fraction", "host_s_per_layer_pass"):
        assert getattr(got, name) == pytest.approx(getattr(fit, name), rel=1e-4), name
    # PP2 was not fitted: its ranks' passes hold the embedding or the loss, unlike DP2's, so
    # the rate that holds DP2's time per pass describes it to 2 %
    for name, rel in (("tp2", 1e-4), ("dp2", 1e-4), ("pp2", 0.03)):
        want = breakdown(Context.of(cfgs[name]), fit)
        have = breakdown(Context.of(cfgs[name]), got)
        assert have.compute_total_s == pytest.approx(want.compute_total_s, rel=rel), name
        assert predict(cfgs[name], got).step_time_s == pytest.approx(
            predict(cfgs[name], fit).step_time_s, rel=rel), name
    assert breakdown(Context.of(cfgs["pp2"]), got).compute_total_s != pytest.approx(
        breakdown(Context.of(cfgs["pp2"]), fit).compute_total_s, rel=1e-4)


@pytest.mark.parametrize("tp_s", [0.0, 0.0005])
def test_dp2_at_two_microbatch_sizes_fits_the_elementwise_time_per_pass_tp2_what_tp_adds(
        layouts, tmp_path, tp_s):
    """Model revision 14: DP2 at microbatches of 1 and of 2 (one pass size each, no TP) separate
    the elementwise work's time per pass from its rate; TP2 then gives what a TP rank's pass adds
    (none where the known constants add none). TP2 at microbatches of 4 was not fitted: its
    compute is the known constants'."""
    fit, paths, cfgs, _ = layouts
    known = replace(fit, call_s=tuple(sorted((dict(CALLS) | ({compute.ELEMENTWISE_TP: tp_s}
                                                             if tp_s else {})).items())))
    more = {"dp2m2": config(tmp_path, "dp2m2", 2, 1, 1, 2, mbs=2),
            "tp2m4": config(tmp_path, "tp2m4", 2, 2, 1, 8, mbs=4)}
    cfgs = cfgs | {k: load_config(v) for k, v in more.items()}
    folders = {k: synthetic_profile(tmp_path / f"profile_{k}", cfgs[k], known)
               for k in ("tp2", "dp2", "dp2m2")}
    got = calibrate.solve_joint([(calibrate.from_profile(folders[k], cfgs[k]), cfgs[k])
                                 for k in folders])
    calls = dict(got.call_s)
    assert calls["elementwise"] == pytest.approx(dict(CALLS)["elementwise"], rel=1e-3)
    assert calls.get(compute.ELEMENTWISE_TP, 0.0) == pytest.approx(tp_s, rel=1e-3, abs=1e-9)
    assert got.elementwise_passes == pytest.approx(fit.elementwise_passes, rel=1e-3)
    for name in ("tp2", "dp2", "dp2m2", "tp2m4", "pp2"):
        want = breakdown(Context.of(cfgs[name]), known)
        have = breakdown(Context.of(cfgs[name]), got)
        assert have.compute_total_s == pytest.approx(want.compute_total_s, rel=1e-3), name


def test_what_tp_adds_to_a_pass_counts_on_tp_ranks_only(layouts):
    """`compute.ELEMENTWISE_TP` adds to every layer pass of a TP rank (TP2: twice DP2's passes)
    and to none of a rank without TP."""
    fit, _, cfgs, _ = layouts
    extra = replace(fit, call_s=(*fit.call_s, (compute.ELEMENTWISE_TP, 0.001)))
    added = {}
    for name in ("tp2", "dp2"):
        ctx = Context.of(cfgs[name])
        added[name] = (rank_compute(ctx, extra, 0)["elementwise"]
                       - rank_compute(ctx, fit, 0)["elementwise"])
    layers, mbs = cfgs["tp2"].model.num_layers, cfgs["tp2"].derived.num_microbatches
    assert added["dp2"] == 0.0
    assert added["tp2"] == pytest.approx(layers * mbs * 0.001)


def test_layouts_of_one_pass_size_keep_no_time_per_pass(layouts):
    """DP2 and PP2 run their passes at one size (the same per-pass work): nothing separates a
    time per pass from the rate, so the fit keeps none, as a single profile's does; and the
    model without it describes DP2 and PP2 with one rate."""
    fit, _, cfgs, folders = layouts
    flat = replace(fit, call_s=())
    tmp = folders["dp2"].parent
    profiles = {k: synthetic_profile(tmp / f"flat_{k}", cfgs[k], flat) for k in ("dp2", "pp2")}
    runs = [(calibrate.from_profile(profiles[k], cfgs[k]), cfgs[k]) for k in ("dp2", "pp2")]
    assert calibrate.solve_joint(runs).call_s == ()
    alone = calibrate.solve(calibrate.from_profile(folders["tp2"], cfgs["tp2"]), cfgs["tp2"])
    assert alone.call_s == ()


def test_the_calibration_file_keeps_the_times_per_pass(layouts, tmp_path):
    _, paths, _, folders = layouts
    out = tmp_path / "cal.toml"
    assert main(["plan", "--calibrate", str(folders["tp2"]), str(folders["dp2"]),
                 "--calibration-out", str(out), "--config", str(paths["tp2"]),
                 "--config", str(paths["dp2"])]) == 0
    assert "\n[fitted.call_s]\n" in out.read_text()                  # as data
    got = dict(calibrate.read(out).fit.call_s)
    assert got.keys() == set(dict(CALLS)) | {compute.ELEMENTWISE_TP}
    assert {k: v for k, v in got.items() if not k.startswith("elementwise")} == pytest.approx(
        {k: v for k, v in CALLS if not k.startswith("elementwise")}, rel=1e-4)


def _mbs_config(tmp: Path, name: str, minibs: int, mbs: int) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(f'base = "{Path(__file__).resolve().parents[1] / "configs" / "tiny_cpu.toml"}"'
                    f'\n\n[parallel]\ntp = 2\npp = 1\nvp = 1\n\n[batch]\nminibs = {minibs}\n'
                    f'micro_batch_size = {mbs}\n\n[system]\ngpus_per_rack = 2\nracks = 1\n')
    return path


def test_the_gemms_time_per_pass_grows_with_the_microbatch_the_elementwise_does_not(tmp_path):
    """Model revision 3: a GEMM's or the attention's time that TP does not split is per sequence
    of the microbatch (it grows with the tokens, not with the split width), so TP2 with two
    microbatches of 4 adds twice what four microbatches of 1 do (twice the sequences); the
    elementwise work's is per pass (the operators' dispatch), half as much in half the passes.
    The extra layouts of 2026-12-05T1200Z measured TP2's GEMMs and attention at mbs 4 twice
    their time at mbs 1 for twice the sequences (docs/planner.md)."""
    fit = replace(calibrate.fitted(), **KNOWN)
    added = {}
    for name, minibs, mbs in (("m1", 4, 1), ("m4", 8, 4)):
        ctx = Context.of(load_config(_mbs_config(tmp_path, name, minibs, mbs)))
        with_, without = (rank_compute(ctx, f, 0) for f in (fit, replace(fit, call_s=())))
        added[name] = {k: with_[k] - without[k] for k in with_}
    for k in ("qkv", "attention", "proj", "ffn_up", "ffn_down", "logits"):
        assert added["m4"][k] == pytest.approx(2 * added["m1"][k]), k
    assert added["m4"]["elementwise"] == pytest.approx(added["m1"]["elementwise"] / 2)


def test_the_norms_are_split_over_tp_only_with_sequence_parallelism(tmp_path):
    """Without sequence parallelism (the CPU path) every TP rank runs the two norms and the
    residual stream on the whole hidden state: 4h elements per token unsplit; with it, 4h / TP."""
    cfg = load_config(_mbs_config(tmp_path, "tp2", 4, 1))
    assert not cfg.parallel.sequence_parallel
    sp = replace(cfg, parallel=replace(cfg.parallel, sequence_parallel=True))
    off, _ = compute.elementwise_width(Context.of(cfg), False)
    on, _ = compute.elementwise_width(Context.of(sp), False)
    assert off - on == pytest.approx(4 * cfg.model.hidden_size * (1 - 1 / 2))
