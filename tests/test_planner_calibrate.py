"""`plan --calibrate`: the planner's constants fitted to a profile (docs/planner.md, "Calibrating
from a profile"). The fit recovers known constants from a synthetic profile the planner writes
of its own prediction (round trip); a profile or a calibration of another system, model or
precision is refused naming the field and both values (exit 2); the published calibration, now
a profile summary, reproduces the published constants and the 128-rack step; first contact's
layer phase is a partial calibration (the BF16 GEMM rate)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from llama31_405b.cli import main
from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, predict
from llama31_405b.planner.calibrate.synthetic import synthetic_profile
from llama31_405b.planner.calibrate import CALIBRATION, load_summary, PUBLISHED
from llama31_405b.planner.spec import make_config

REPO = Path(__file__).resolve().parents[1]
GB200_128 = REPO / "configs" / "config_GB200_2048x4x8xtp4pp8cp2.toml"
KNOWN = dict(attention_bf16_fraction=0.09, elementwise_passes=31.0, host_s_per_layer_pass=0.004,
             gemm_fraction=(("fp32", 0.3),),
             gemm_part_scale=(("logits", 1.4), ("proj", 0.8), ("qkv", 1.2)),
             comm_scale=(("PP", 2.0),), collective_latency_s=0.005, nvlink_bus_efficiency=0.2)
"""A CPU's constants: gloo's one transport (systems/cpu.toml `one_transport`) has a latency and a
bandwidth (nvlink_bus_efficiency), the pipeline's sends a scale of their own."""


def tiny(tmp: Path, name: str, **layout) -> Path:
    """A tiny CPU config of `layout` (8 ranks in one rack: TP, PP and DP all present)."""
    lay = dict(tp=2, pp=2, vp=1, minibs=4, mbs=1) | layout
    path = tmp / f"{name}.toml"
    path.write_text(f'base = "{REPO / "configs" / "tiny_cpu.toml"}"\n\n[parallel]\ntp = {lay["tp"]}\n'
                    f'pp = {lay["pp"]}\nvp = {lay["vp"]}\n\n[batch]\nminibs = {lay["minibs"]}\n'
                    f'micro_batch_size = {lay["mbs"]}\n\n[system]\ngpus_per_rack = 8\nracks = 1\n')
    return path


def known_fit():
    return replace(calibrate.fitted(), **KNOWN)


def run(capsys, *argv):
    rc = main(["plan", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_fit_recovers_known_constants_from_a_synthetic_profile(tmp_path):
    """The planner writes a profile folder of its own prediction with known constants; the
    calibration from it gives those constants back, and the simulated step the profiled one."""
    cfg = load_config(tiny(tmp_path, "tp2pp2dp2"))
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.derived.dp) == (2, 2, 2)
    fit = known_fit()
    folder = synthetic_profile(tmp_path / "synthetic", cfg, fit)
    got = calibrate.solve(calibrate.from_profile(folder, cfg), cfg)
    for name in ("attention_bf16_fraction", "elementwise_passes", "host_s_per_layer_pass"):
        assert getattr(got, name) == pytest.approx(getattr(fit, name), rel=1e-6), name
    for table in ("gemm_fraction", "gemm_part_scale"):
        assert dict(getattr(got, table)) == pytest.approx(dict(getattr(fit, table)), rel=1e-6)
    # the transport's latency and bandwidth from TP's small and DP's large collectives; TP and DP
    # follow from them (scale 1), the pipeline sends keep theirs (solved with the bubble)
    assert (got.collective_latency_s, got.nvlink_bus_efficiency) == pytest.approx((0.005, 0.2),
                                                                                  rel=1e-6)
    scales = dict(got.comm_scale)
    assert {k: scales.get(k, 1.0) for k in ("TP", "PP", "DP", "CP")} == pytest.approx(
        {"TP": 1.0, "PP": 2.0, "DP": 1.0, "CP": 1.0}, rel=1e-6)
    assert predict(cfg, got).step_time_s == pytest.approx(predict(cfg, fit).step_time_s, rel=1e-9)


def test_a_system_of_several_links_fits_one_scale_per_measured_kind(tmp_path):
    """GB200 (NVLink inside the rack, InfiniBand across, NCCL): no one transport, so each
    measured kind gets its own scale from a synthetic profile of the published layout."""
    cfg = load_config(GB200_128)
    fit = replace(calibrate.fitted(), comm_scale=(("CP", 2.0), ("DP", 3.0), ("PP", 1.5), ("TP", 1.2)),
                  host_s_per_layer_pass=1e-4)
    got = calibrate.solve(calibrate.from_profile(synthetic_profile(tmp_path / "p", cfg, fit),
                                                 cfg), cfg)
    assert dict(got.comm_scale) == pytest.approx(dict(fit.comm_scale), rel=1e-5)
    assert got.collective_latency_s is None


def test_calibrate_command_writes_a_calibration_the_other_commands_use(tmp_path, capsys):
    cfg_path = tiny(tmp_path, "fit")
    cfg = load_config(cfg_path)
    folder = synthetic_profile(tmp_path / "profile", cfg, known_fit())
    out = tmp_path / "cal.toml"
    rc, text, err = run(capsys, "--calibrate", str(folder), "--calibration-out", str(out))
    assert rc == 0, err
    cal = calibrate.read(out)
    assert cal.summary.source == str(folder.resolve()) and cal.gemm_precision == "fp32"
    assert (cal.summary.system, cal.summary.model) == ("cpu", "tiny-llama3.1")
    assert cal.fit.host_s_per_layer_pass == pytest.approx(0.004, rel=1e-6)
    # never overwritten
    before = out.read_text()
    rc, _, err = run(capsys, "--calibrate", str(folder), "--calibration-out", str(out))
    assert rc == 2 and "never overwritten" in err and out.read_text() == before
    # another layout of the same model, predicted with the calibration
    other = tiny(tmp_path, "dp", tp=1, pp=1, minibs=1)
    rc, text, err = run(capsys, "--config", str(other), "--calibration", str(out), "--json")
    assert rc == 0, err
    assert json.loads(text)["step_time_s"] == pytest.approx(
        predict(load_config(other), known_fit()).step_time_s, rel=1e-6)


def test_a_profile_or_calibration_of_another_system_model_or_precision_is_refused(tmp_path, capsys):
    cfg = load_config(tiny(tmp_path, "fit"))
    folder = synthetic_profile(tmp_path / "profile", cfg, known_fit())
    # --calibrate: what the calibration asks for against what the profile is
    rc, _, err = run(capsys, "--calibrate", str(folder), "--calibration-out",
                     str(tmp_path / "a.toml"), "--system", "gb200-nvl72")
    assert rc == 2 and "system 'cpu', --system asks for 'gb200-nvl72'" in err
    rc, _, err = run(capsys, "--calibrate", str(folder), "--calibration-out",
                     str(tmp_path / "b.toml"), "--precision", "nvfp4")
    assert rc == 2 and "precision 'fp32', --precision asks for 'nvfp4'" in err
    other_model = tmp_path / "wide.toml"
    other_model.write_text(f'base = "{tmp_path / "fit.toml"}"\n\n[model]\nname = "wider"\n')
    rc, _, err = run(capsys, "--calibrate", str(folder), "--calibration-out",
                     str(tmp_path / "c.toml"), "--config", str(other_model))
    assert rc == 2 and "model: the profile has 'tiny-llama3.1', the config 'wider'" in err
    assert not any((tmp_path / f"{x}.toml").exists() for x in "abc")
    # --calibration: a CPU calibration for the 405B GB200 config
    cal = tmp_path / "cal.toml"
    assert run(capsys, "--calibrate", str(folder), "--calibration-out", str(cal))[0] == 0
    rc, _, err = run(capsys, "--config", str(GB200_128), "--calibration", str(cal))
    assert rc == 2
    assert "calibrated for system.id = 'cpu', the config has 'gb200-nvl72'" in err
    assert "calibrated for model.name = 'tiny-llama3.1', the config has 'llama3.1-405b'" in err
    assert "= 'fp32', the config has 'nvfp4'" in err
    # the same model on CPU in emulated NVFP4 executes FP32 GEMMs: accepted
    nvfp4 = tmp_path / "nvfp4.toml"
    nvfp4.write_text(f'base = "{tmp_path / "fit.toml"}"\n\n[precision]\ncompute = "nvfp4"\n')
    assert run(capsys, "--config", str(nvfp4), "--calibration", str(cal))[0] == 0
    rc, _, err = run(capsys, "--write-configs", "--configs-dir", str(tmp_path), "--calibration",
                     str(cal))
    assert rc == 2 and "--write-configs writes llama3.1-405b configs" in err
    rc, _, err = run(capsys, "--explain", "--out", str(tmp_path / "x.png"), "--calibration", str(cal))
    assert rc == 2 and "--explain tabulates the GB200 configs" in err
    assert not (tmp_path / "x.png").exists()
    rc, _, err = run(capsys, "--config", str(GB200_128), "--calibration", str(tmp_path / "none.toml"))
    assert rc == 2 and "no such calibration file" in err
    # profile's predicted column: refused before the analysis (and before a run)
    rc = main(["profile", "--analyze", str(folder), str(GB200_128), "--calibration", str(cal)])
    assert rc == 2 and "calibrated for system.id = 'cpu'" in capsys.readouterr().err


def test_published_calibration_is_a_profile_summary_and_reproduces_the_constants(tmp_path, capsys):
    assert load_summary(PUBLISHED) == CALIBRATION
    assert (CALIBRATION.step_s, CALIBRATION.compute_s) == (1.27, 0.733)
    assert CALIBRATION.closes == "nvlink_bus_efficiency" and not CALIBRATION.parts
    f = calibrate.solve(CALIBRATION)
    assert f == calibrate.fitted()
    # the constants the solver gives (nvlink_bus_efficiency 0.49303 before the simulation counted
    # megatron-core's reverse-order dispatch of the interleaved first chunk's gather, 0.49431 until
    # model revision 6 put the LM head in BF16: the last rank's 23 ms more compute close the same
    # step with faster NVLink; 0.54028, 0.73952, 22.148, 0.53071 until model revision 9 took the
    # inner rank's own DP slowdown and left the vocabulary out of the first and last chunks' casts;
    # 0.53039 until model revision 16 counted megatron-core's 4 buckets on the first chunk, not 10,
    # and the embedding's bucket, 40 % of it, as the first forward's gather)
    assert (f.nvfp4_gemm_peak_fraction, f.attention_bf16_fraction, f.elementwise_passes,
            f.nvlink_bus_efficiency) == pytest.approx((0.53984, 0.73893, 22.167, 0.52975), rel=1e-4)
    # written as a calibration file and used: the same 128-rack step
    path = calibrate.write(tmp_path / "published.toml", CALIBRATION, f, "nvfp4", {})
    assert calibrate.read(path).fit == f
    rc, out, err = run(capsys, "--config", str(GB200_128), "--calibration", str(path), "--json")
    assert rc == 0, err
    assert json.loads(out)["step_time_s"] == pytest.approx(1.27, rel=1e-6)


def test_first_contact_layer_phase_is_a_partial_calibration(tmp_path, capsys):
    """A first-contact report whose 'full' layer took what the planner predicts at a BF16 GEMM
    efficiency of 0.6 (with the unfused attention it ran) calibrates that efficiency."""
    prior = calibrate.fitted()
    truth = replace(prior, gemm_fraction=(("bf16", 0.6),))
    shapes = {"full": {"heads": 128, "seq": 4096}, "tp4_shard": {"heads": 32, "seq": 4096}}
    from llama31_405b.planner import compute
    from llama31_405b.planner.context import Context
    from llama31_405b.config.schema import ModelConfig
    data = {}
    for name, s in shapes.items():
        cfg = make_config("h100-sxm", 1, tp=128 // s["heads"], pp=1, vp=1, cp=1, minibs=1,
                          precision="bf16", model=ModelConfig(seq_length=s["seq"]))
        ctx = Context.of(cfg)
        ctx = replace(ctx, system=replace(ctx.system, attention_kernel="unfused"))
        fwd, bwd = compute.chunk_parts(ctx, 1, False, False, truth)
        data[name] = dict(s, fwd_s=fwd.total, bwd_s=bwd.total)
    report = tmp_path / "first_contact.json"
    report.write_text(json.dumps({"meta": {"system": "h100-sxm"}, "checks": [
        {"name": "layer_bf16", "status": "passed", "data": data}]}))
    out = tmp_path / "fc.toml"
    rc, text, err = run(capsys, "--calibrate", str(report), "--calibration-out", str(out))
    assert rc == 0, err
    cal = calibrate.read(out)
    assert cal.partial and dict(cal.fit.gemm_fraction)["bf16"] == pytest.approx(0.6, rel=1e-6)
    assert cal.fit.nvfp4_gemm_peak_fraction == prior.nvfp4_gemm_peak_fraction
    rc, _, err = run(capsys, "--calibrate", str(report), "--calibration-out",
                     str(tmp_path / "x.toml"), "--system", "gb200-nvl72")
    assert rc == 2 and "first contact ran on system 'h100-sxm'" in err
    # first contact's own reports name the GPU, not the system file: --system then
    doc = json.loads(report.read_text())
    doc["meta"] = {}
    doc["checks"].insert(0, {"name": "gpu", "status": "passed", "data": {"name": "NVIDIA H100"}})
    report.write_text(json.dumps(doc))
    rc, _, err = run(capsys, "--calibrate", str(report), "--calibration-out", str(tmp_path / "y.toml"))
    assert rc == 2 and "does not name the system (its GPU: NVIDIA H100); give --system" in err
    rc, _, err = run(capsys, "--calibrate", str(report), "--calibration-out",
                     str(tmp_path / "y.toml"), "--system", "h100-sxm")
    assert rc == 0, err
    assert dict(calibrate.read(tmp_path / "y.toml").fit.gemm_fraction)["bf16"] == pytest.approx(0.6)


def test_several_profiles_of_the_fit_layout_calibrate_to_their_median(tmp_path, capsys):
    """Three profiles of one layout on a drifting machine (the same constants but one host time
    each): the calibration fits the median one; a profile of another layout is refused."""
    cfg_path = tiny(tmp_path, "fit")
    cfg = load_config(cfg_path)
    folders = [synthetic_profile(tmp_path / f"p{i}", cfg,
                                 replace(known_fit(), host_s_per_layer_pass=h))
               for i, h in enumerate((0.004, 0.009, 0.002))]
    out = tmp_path / "median.toml"
    rc, text, err = run(capsys, "--calibrate", *map(str, folders), "--calibration-out", str(out))
    assert rc == 0, err
    cal = calibrate.read(out)
    assert cal.fit.host_s_per_layer_pass == pytest.approx(0.004, rel=1e-6)
    assert cal.summary.source.startswith("median of ") and str(folders[2].resolve()) in cal.summary.source
    other = synthetic_profile(tmp_path / "dp", load_config(tiny(tmp_path, "dp", tp=1, pp=1, minibs=1)),
                              known_fit())
    rc, _, err = run(capsys, "--calibrate", str(folders[0]), str(other), "--calibration-out",
                     str(tmp_path / "mixed.toml"), "--config", str(cfg_path))
    assert rc == 2 and f"{other}: tp: the profile has 1, the config 2" in err


def test_a_calibration_of_another_model_revision_is_refused(tmp_path, capsys):
    """A calibration records the model revision it was fitted under; `plan --calibration` (and
    the memory checks, through the same `mismatches`) refuse a file of another revision, or one
    that records none, naming the file, both revisions and what to do."""
    f = calibrate.fitted()
    path = calibrate.write(tmp_path / "now.toml", CALIBRATION, f, "nvfp4", {})
    assert calibrate.read(path).model_revision == calibrate.MODEL_REVISION
    rc, _, err = run(capsys, "--config", str(GB200_128), "--calibration", str(path), "--json")
    assert rc == 0, err
    text = path.read_text()
    line = f"model_revision = {calibrate.MODEL_REVISION}\n"
    assert line in text
    for name, edited, said in (
            ("old.toml", text.replace(line, f"model_revision = {calibrate.MODEL_REVISION - 1}\n"),
             f"was fitted under model revision {calibrate.MODEL_REVISION - 1}"),
            ("none.toml", text.replace(line, ""), "records no model revision")):
        (tmp_path / name).write_text(edited)
        rc, _, err = run(capsys, "--config", str(GB200_128), "--calibration", str(tmp_path / name))
        assert rc == 2 and said in err and f"at revision {calibrate.MODEL_REVISION}" in err, err
        assert str(tmp_path / name) in err and "plan --calibrate" in err
    (tmp_path / "bad.toml").write_text(text.replace(line, 'model_revision = "four"\n'))
    with pytest.raises(ValueError, match="model_revision = 'four': not a whole number"):
        calibrate.read(tmp_path / "bad.toml")
