"""`plan --calibrate` over the folders of several layouts, one `--config` each (issue 46, point 3):
no 2-rank layout has both TP's small and DP's large collectives, so the transport's latency comes
from TP2's profile and its bandwidth from DP2's, in one fit (planner/calibrate/joint.py). The
round trip: synthetic profiles the planner writes of its own prediction with known constants, fitted
jointly, give those constants back and predict a third layout (PP2) as the known constants do;
either profile alone cannot (no latency without DP, no bandwidth without TP). Folders and configs
that do not pair up are refused naming them."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from llama31_405b.cli import main
from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, predict
from llama31_405b.planner.calibrate.joint import mean
from llama31_405b.planner.calibrate.synthetic import synthetic_profile

REPO = Path(__file__).resolve().parents[1]
KNOWN = dict(attention_bf16_fraction=0.09, elementwise_passes=31.0, host_s_per_layer_pass=0.004,
             gemm_fraction=(("fp32", 0.3),),
             gemm_part_scale=(("logits", 1.4), ("proj", 0.8), ("qkv", 1.2)),
             collective_latency_s=0.005, nvlink_bus_efficiency=0.2)


def two_rank(tmp: Path, name: str, tp: int, pp: int, minibs: int) -> Path:
    """A tiny CPU config of 2 ranks (one rack of 2)."""
    path = tmp / f"{name}.toml"
    path.write_text(f'base = "{REPO / "configs" / "tiny_cpu.toml"}"\n\n[parallel]\ntp = {tp}\n'
                    f'pp = {pp}\nvp = 1\n\n[batch]\nminibs = {minibs}\nmicro_batch_size = 1\n\n'
                    '[system]\ngpus_per_rack = 2\nracks = 1\n')
    return path


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """TP2, DP2 and PP2 configs and synthetic profiles of TP2 and DP2 with the known constants."""
    tmp = tmp_path_factory.mktemp("joint")
    fit = replace(calibrate.fitted(), **KNOWN)
    paths = {"tp2": two_rank(tmp, "tp2", 2, 1, 4), "dp2": two_rank(tmp, "dp2", 1, 1, 2),
             "pp2": two_rank(tmp, "pp2", 1, 2, 4)}
    cfgs = {k: load_config(v) for k, v in paths.items()}
    assert [(c.parallel.tp, c.parallel.pp, c.derived.dp) for c in cfgs.values()] == [
        (2, 1, 1), (1, 1, 2), (1, 2, 1)]
    folders = {k: synthetic_profile(tmp / f"profile_{k}", cfgs[k], fit) for k in ("tp2", "dp2")}
    return tmp, fit, paths, cfgs, folders


def test_the_joint_fit_recovers_the_transport_from_tp2_and_dp2(layouts):
    _, fit, _, cfgs, folders = layouts
    runs = [(calibrate.from_profile(folders[k], cfgs[k]), cfgs[k]) for k in ("tp2", "dp2")]
    got = calibrate.solve_joint(runs)
    assert (got.collective_latency_s, got.nvlink_bus_efficiency) == pytest.approx((0.005, 0.2),
                                                                                  rel=1e-5)
    for name in ("attention_bf16_fraction", "elementwise_passes", "host_s_per_layer_pass"):
        assert getattr(got, name) == pytest.approx(getattr(fit, name), rel=1e-5), name
    assert dict(got.gemm_fraction) == pytest.approx(dict(fit.gemm_fraction), rel=1e-5)
    # the unseen third layout is predicted as the known constants predict it
    assert predict(cfgs["pp2"], got).step_time_s == pytest.approx(
        predict(cfgs["pp2"], fit).step_time_s, rel=1e-5)


def test_neither_profile_alone_finds_the_transport(layouts):
    """Alone, TP2 has no DP and DP2 no TP: no latency and bandwidth pair is fitted (a scale per
    measured kind instead), so the joint fit is what point 3 needs."""
    _, _, _, cfgs, folders = layouts
    for k in ("tp2", "dp2"):
        alone = calibrate.solve(calibrate.from_profile(folders[k], cfgs[k]), cfgs[k])
        assert alone.collective_latency_s is None, k


def test_mean_averages_numbers_and_tables_by_name():
    a = replace(calibrate.fitted(), host_s_per_layer_pass=1.0, comm_scale=(("TP", 2.0),))
    b = replace(calibrate.fitted(), host_s_per_layer_pass=3.0,
                comm_scale=(("DP", 5.0), ("TP", 4.0)))
    m = mean([a, b])
    assert m.host_s_per_layer_pass == 2.0 and dict(m.comm_scale) == {"DP": 5.0, "TP": 3.0}
    assert mean([a, a]).collective_latency_s is None


def run(capsys, *argv):
    rc = main(["plan", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_calibrate_command_fits_two_layouts_with_one_config_each(layouts, capsys):
    tmp, _, paths, _, folders = layouts
    out = tmp / "joint.toml"
    rc, text, err = run(capsys, "--calibrate", str(folders["tp2"]), str(folders["dp2"]),
                        "--calibration-out", str(out), "--config", str(paths["dp2"]),
                        "--config", str(paths["tp2"]))
    assert rc == 0, err
    cal = calibrate.read(out)
    assert cal.fit.collective_latency_s == pytest.approx(0.005, rel=1e-5)
    # [run] is the first --config's layout; the other is named in [calibration] `also` and
    # has its own [check]
    assert (cal.summary.tp, cal.summary.pp) == (1, 1)
    raw = out.read_text()
    assert "also = [\"TP2-PP1-VP1-CP1 MiniBS 4 MBS 1" in raw and "[check.also_1]" in raw
    assert text.count("the profiled step of") == 2


def test_folders_and_configs_that_do_not_pair_are_refused(layouts, capsys):
    tmp, _, paths, _, folders = layouts
    rc, _, err = run(capsys, "--calibrate", str(folders["tp2"]), "--calibration-out",
                     str(tmp / "x.toml"), "--config", str(paths["tp2"]), "--config",
                     str(paths["dp2"]))
    assert rc == 2 and f"--config {paths['dp2']}: no folder of its layout" in err
    rc, _, err = run(capsys, "--calibrate", str(folders["tp2"]), str(folders["dp2"]),
                     "--calibration-out", str(tmp / "y.toml"), "--config", str(paths["tp2"]),
                     "--config", str(paths["pp2"]))
    assert rc == 2 and f"{folders['dp2']}: its layout is that of 0 of the --config files" in err
    assert not (tmp / "x.toml").exists() and not (tmp / "y.toml").exists()
    # plan predicts one config
    rc, _, err = run(capsys, "--config", str(paths["tp2"]), "--config", str(paths["dp2"]))
    assert rc == 2 and "--config given 2 times" in err
