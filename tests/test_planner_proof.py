"""The planner's published proof on CPU re-derives from its committed summaries (issue 46).

bench/planner_vs_measured.py profiles the layouts the proof file fixes (bench/planner_proof.toml)
and writes the summaries behind the table into docs/planner_proof/<run>/ (each round's reduced
analysis.json, the layouts' configs, the calibration files, table.json and table.md);
`test_committed_runs_rederive` re-derives every such folder's table with the planner's own
calibration and prediction (bench/planner_proof/derive.py) and fails where the committed table
disagrees (one run as of 2026-12-05: docs/planner_proof/2026-12-05T0308Z). The tests on a
synthetic summaries folder below check the derivation itself: a known miss, a known median.

The synthetic folder: profiles written by `calibrate.synthetic.synthetic_profile` (the planner's
own prediction, written as `profile` writes a measurement) with made-up constants (`MADE_UP`,
no measurement), some of its figures then changed by hand (named in each test), so that the
re-derived table has known ratios, a known miss and a known median.
"""
from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.planner_proof import derive, render, spec, summaries  # noqa: E402

RUNS = ROOT / "docs" / "planner_proof"


def made_up():
    """Synthetic constants (not fitted to anything): FP32 GEMMs at 0.3 of the peak, 3 ms of host
    per layer pass, a 2 ms transport latency, 8 % of the nominal bandwidth, a core kept busy
    30 % of the time in communication where 4 ranks share the 2 cores."""
    from llama31_405b.planner import calibrate
    return replace(calibrate.fitted(), gemm_fraction=(("fp32", 0.3),),
                   host_s_per_layer_pass=0.003, collective_latency_s=0.002,
                   nvlink_bus_efficiency=0.08, comm_core_fraction=0.3)


def _edit(folder: Path, step: float = 1.0, rows: dict | None = None) -> None:
    """Scale a synthetic round's measured step by `step` and its rows by `rows` (component ->
    factor): figures made up by hand."""
    p = folder / "analysis.json"
    a = json.loads(p.read_text())
    a["measured_step_s"] *= step
    for r in a["comparison"]:
        r["measured_s"] *= (rows or {}).get(r["component"], 1.0)
    p.write_text(json.dumps(a))


def check_run(run: Path, tmp: Path) -> None:
    """The committed table of `run` is the one its summaries give (JSON and markdown), and each
    committed calibration file holds the constants the re-derivation fits. A table of an earlier
    model revision (`calibrate.MODEL_REVISION`; 1 where the table names none) re-derives under
    that revision's code only (its run.json names the commit): here its markdown is its JSON's."""
    from llama31_405b.planner import calibrate
    committed = json.loads((run / "table.json").read_text())
    if committed.get("model_revision", 1) != calibrate.MODEL_REVISION:
        assert committed.get("model_revision", 1) < calibrate.MODEL_REVISION, run
        assert render.markdown(committed) == (run / "table.md").read_text(), f"{run}/table.md"
        assert len(json.loads((run / "run.json").read_text())["commit"]) == 40, run
        return
    table = derive.derive(run, tmp)
    diffs = derive.differences(table, committed)
    assert not diffs, f"{run}: the committed table disagrees with its summaries: {diffs[:5]}"
    assert render.markdown(table) == (run / "table.md").read_text(), f"{run}/table.md"
    for s in table["sections"]:
        if s["calibration"]:
            fit = calibrate.read(run / s["calibration"]).fit
            assert not derive.differences(derive.fitted_dict(fit), s["fitted"]), s["name"]


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory) -> Path:
    """A summaries folder under the committed proof file, every figure synthetic: pp2dp2's PP
    (with the bubble) measured 1.5 x the prediction, its step unchanged (a component miss, the
    step within 15 %); dp4's rounds 1.0, 1.3 and 0.9 x the predicted step (median: round 1)."""
    from llama31_405b.config.load import load_config
    from llama31_405b.planner.calibrate.synthetic import synthetic_profile
    run = tmp_path_factory.mktemp("proof") / "synthetic_run"
    run.mkdir()
    shutil.copyfile(spec.PROOF, run / "proof.toml")
    proof = spec.load(run / "proof.toml")
    fit = made_up()
    for n in proof.profiled:
        cfg = load_config(spec.committed_config(proof.layouts[n], run / "layouts" / n))
        for r in range(1, proof.rounds + 1):
            synthetic_profile(summaries.round_folder(run, n, r), cfg, fit)
    for r in range(1, proof.rounds + 1):
        _edit(summaries.round_folder(run, "pp2dp2", r), rows={"PP exposed (incl. bubble)": 1.5})
    for r, k in zip(range(1, 4), (1.0, 1.3, 0.9)):
        _edit(summaries.round_folder(run, "dp4", r), step=k)
    table = derive.derive(run, run / "calibration")
    (run / "table.json").write_text(json.dumps(table, indent=1) + "\n")
    (run / "table.md").write_text(render.markdown(table))
    return run


def test_the_proof_file_fixes_the_proof():
    p = spec.load()
    assert (p.date, p.step_tol, p.component_tol, p.negligible) == ("2026-12-07T1732Z", 0.15, 0.25,
                                                                    0.05)
    assert (p.rounds, p.steps) == (3, 16)   # the fourth file: 16 profiled steps, 4 before
    assert "committed_before_measurement = true" in p.text
    four, two = p.sections
    # the 4-rank layout with both collective sizes, its 2-rank replica (core sharing fitted) and
    # DP2 (the kernels' time per pass apart from their rate)
    # and (the fifth file, model revision 19) a twin with the GB200 settings' overlapped DP;
    # (the sixth, revision 21) the unseen DP4's twin with it, DP peers sharing cores
    # (the seventh, revision 22) the first with a pipeline, PP2 x VP2 at 2 ranks, in both sections
    assert (four.fit, four.unseen) == (("tp2dp2", "tp2", "dp2", "ovtp2dp2", "ovdp4", "pp2vp2"),
                                       ("dp4", "pp2dp2", "pp2dp2vp2", "tp2pp2", "gb200"))
    assert (sorted(two.fit), two.unseen) == (["dp2", "ovdp2", "pp2vp2", "tp2"], ("pp2",))
    assert dict(p.layouts["pp2vp2"].overrides) == dict(p.layouts["pp2dp2vp2"].overrides)
    assert (p.layouts["pp2vp2"].ranks, p.layouts["pp2dp2vp2"].ranks) == (2, 4)
    for a, b in (("tp2dp2", "ovtp2dp2"), ("dp2", "ovdp2"), ("dp4", "ovdp4")):
        assert dict(p.layouts[b].overrides) == dict(p.layouts[a].overrides) | {
            "overlap": 1, "bucket": 32768}
    assert {p.layouts[n].ranks for n in two.layouts} == {2}
    assert all(p.layouts[a].ranks == 2 and p.layouts[b].ranks == 4 for a, b in p.core_pairs)


def test_synthetic_table_rederives_with_its_misses(synthetic_run, tmp_path):
    t = json.loads((synthetic_run / "table.json").read_text())
    four, two = t["sections"]
    proof = spec.load(synthetic_run / "proof.toml")
    assert [r["layout"] for r in four["rows"]] == list(proof.sections[0].layouts)
    rows = {r["layout"]: r for r in four["rows"]}
    pp = rows["pp2dp2"]
    assert pp["ratio"]["PP"] == pytest.approx(1.5) and pp["verdict"]["PP"] == "miss"
    assert pp["verdict"]["step"] == "ok"
    assert four["verdict"]["misses"] == {"pp2dp2": ["PP"]}
    assert (four["verdict"]["steps_within"], four["verdict"]["all_within"]) == (5, 4)
    assert rows["dp4"]["rounds"] == pytest.approx([1.0, 1.3, 0.9])
    assert rows["dp4"]["ratio"]["step"] == pytest.approx(1.0)
    # the synthetic profiles are the made-up constants' prediction: the fit finds them again
    assert all(r["ratio"]["compute"] == pytest.approx(1.0, rel=1e-6) for r in four["rows"])
    assert "PP2 x DP2 | 1.00" in (synthetic_run / "table.md").read_text()
    assert "miss" in (synthetic_run / "table.md").read_text()
    # the 2-rank fit takes two layouts at once (`plan --calibrate` with one --config each,
    # calibrate.solve_joint): it finds the made-up constants again, so the unseen PP2 is
    # predicted as they predict it
    assert two["calibration"] == "calibration/two_rank.toml" and "refused" not in two
    rows2 = {r["layout"]: r for r in two["rows"]}
    assert [rows2[n]["role"] for n in ("tp2", "dp2", "pp2")] == ["fit", "fit", "unseen"]
    assert rows2["pp2"]["ratio"]["step"] == pytest.approx(1.0, rel=1e-5)
    assert two["fitted"]["collective_latency_s"] == pytest.approx(0.002, rel=1e-5)
    # the ranks pinned (model revision 10), no fit sets the core-sharing fraction: the 4-rank
    # layouts stretch by the ranks per core, the 2-rank ones not at all
    assert four["fitted"]["comm_core_fraction"] is None
    assert two["fitted"]["comm_core_fraction"] is None
    pairs = t["core_share"]["pairs"]
    assert [(p["two"], p["four"]) for p in pairs] == list(proof.core_pairs)
    assert all(p["ratio"] == pytest.approx(1.0, rel=1e-5) for p in pairs)
    assert [p["model_core_share"] for p in pairs] == [2.0, 2.0, 2.0]
    assert [p.get("fit", False) for p in pairs] == [False, True, False]   # tp2 -> tp2dp2 fitted
    assert "| tp2 -> tp2dp2 (fit) |" in (synthetic_run / "table.md").read_text()
    check_run(synthetic_run, tmp_path)


def test_a_committed_table_that_disagrees_fails(synthetic_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(synthetic_run, run)
    t = json.loads((run / "table.json").read_text())
    t["sections"][0]["rows"][1]["verdict"]["PP"] = "ok"
    (run / "table.json").write_text(json.dumps(t))
    with pytest.raises(AssertionError, match=r"rows\[1\]\.verdict\.PP"):
        check_run(run, tmp_path / "c1")
    shutil.copyfile(synthetic_run / "table.json", run / "table.json")
    (run / "table.md").write_text((run / "table.md").read_text().replace("1.50", "1.10"))
    with pytest.raises(AssertionError, match="table.md"):
        check_run(run, tmp_path / "c2")


def test_a_summary_reads_as_its_profile(tmp_path):
    """A summary keeps what the calibration's reader uses: `from_profile` of the reduced folder
    is that of the full one, for a synthetic graphed profile with memory records and per-rank
    detail the summary drops."""
    from llama31_405b.config.load import load_config
    from llama31_405b.planner import calibrate
    from llama31_405b.planner.calibrate.synthetic import Eager, synthetic_profile
    proof = spec.load()
    cfg = load_config(spec.committed_config(proof.layouts["tp2dp2"], tmp_path / "cfg"))
    full = synthetic_profile(tmp_path / "full", cfg, made_up(), with_memory=True,
                             eager=Eager(host_s=0.01, exposed=(("TP", 0.02),)))
    a = json.loads((full / "analysis.json").read_text())
    a["ranks"]["0"]["comm"]["TP"] = {"role": "TP", "total_s": 0.3, "ops": {"gloo:all_reduce": 84}}
    a["ranks"]["1"] = {"comm": {"DP": {"role": "DP", "total_s": 9.0}}}  # not a compared rank
    (full / "analysis.json").write_text(json.dumps(a))
    small = summaries.reduce_profile(full, tmp_path / "small")
    assert json.loads((small / "analysis.json").read_text())["ranks"].keys() == {"0"}
    one, two = calibrate.from_profile(full, cfg), calibrate.from_profile(small, cfg)
    assert one.eager_step_s is not None and one.memory_allocated_gb is not None
    assert replace(two, source=one.source) == one
    with pytest.raises(FileExistsError, match="small exists"):
        summaries.reduce_profile(full, small)


def test_extra_layouts_are_reported_apart(synthetic_run):
    proof = spec.load(synthetic_run / "proof.toml")
    fit = made_up()
    rows = [derive.layout_row(synthetic_run, proof, proof.layouts["pp2"], "extra", fit, {})]
    t = {"layouts_file": "extra.toml", "calibration": "given.toml", "rounds": proof.rounds,
         "tolerance": json.loads((synthetic_run / "table.json").read_text())["tolerance"],
         "rows": rows, "verdict": derive.judge(rows)}
    md = render.extra_markdown(t)
    assert md.startswith("Not part of the published proof") and "PP2 (2 ranks)" in md
    assert t["verdict"]["layouts"] == 1


def test_committed_runs_rederive(tmp_path):
    """Every committed run folder (docs/planner_proof/<run>/table.json) of the current model
    revision re-derives; the four runs of revision 1 (the first of 2026-12-05 among them) keep
    the tables their revision derived."""
    tables = sorted(RUNS.glob("*/table.json"))
    assert RUNS / "2026-12-05T0308Z" / "table.json" in tables
    old = [t.parent.name for t in tables if "model_revision" not in json.loads(t.read_text())]
    assert old == ["2026-12-05T0308Z", "2026-12-05T0440Z", "2026-12-05T0624Z",
                   "2026-12-05T0643Z"]
    for table in tables:
        check_run(table.parent, tmp_path / table.parent.name)


def test_a_table_of_an_earlier_revision_is_not_rederived_but_must_render(synthetic_run, tmp_path):
    """A synthetic table marked revision 1 with a label changed by hand (no re-derivation sees
    it): its markdown still has to be its JSON's, and a revision above the code's is refused."""
    run = tmp_path / "run"
    shutil.copytree(synthetic_run, run)
    (run / "run.json").write_text(json.dumps({"commit": "0" * 40}))
    t = json.loads((run / "table.json").read_text())
    t["model_revision"] = 1
    t["sections"][0]["rows"][1]["label"] = "changed by hand"
    (run / "table.json").write_text(json.dumps(t))
    (run / "table.md").write_text(render.markdown(t))
    check_run(run, tmp_path / "c1")
    assert "| changed by hand" in render.markdown(t)
    (run / "table.md").write_text(render.markdown(t).replace("changed by hand", "PP2 x DP2"))
    with pytest.raises(AssertionError, match="table.md"):
        check_run(run, tmp_path / "c2")
    t["model_revision"] = 99
    (run / "table.json").write_text(json.dumps(t))
    with pytest.raises(AssertionError):
        check_run(run, tmp_path / "c3")


def test_the_bench_writes_a_folder_that_rederives(tmp_path, capsys):
    """bench/planner_vs_measured.py --reuse on a work folder of synthetic profiles (made-up
    constants, as above): the summaries folder it writes holds the proof file, the configs, the
    reduced rounds, the calibration and a table that re-derives; a second run into the same
    folder is refused, naming it."""
    import argparse
    from llama31_405b.config.load import load_config
    from llama31_405b.planner.calibrate.synthetic import synthetic_profile
    bench = _bench()
    proof, work = spec.load(), tmp_path / "work"
    for n in proof.profiled:
        cfg = load_config(spec.committed_config(proof.layouts[n], tmp_path / "cfg" / n))
        for r in range(1, proof.rounds + 1):
            synthetic_profile(work / f"profile_{n}_r{r}", cfg, made_up())
    (work / "loads.json").write_text(json.dumps({"dp4/r1": [1.0, 2.0], "dp4/r3": [0.5, 1.5]}))
    for r in range(1, proof.rounds + 1):   # dp4's profiles split the waits: 10, 20, 30 ms
        p = work / f"profile_dp4_r{r}" / "analysis.json"
        p.write_text(json.dumps(json.loads(p.read_text()) | {
            "waiting_for_peers": {"DP": 0.01 * r, "TP": 0.0}}))
    # the reference GEMM's times: the run's median is 60 ms, dp4's slowest 90 and fastest 54
    (work / "speed.json").write_text(json.dumps(
        {"dp4/r1": [90.0, 60.0], "dp4/r2": [54.0, 60.0], "tp2/r1": [60.0, 60.0],
         "gone/r1": [1.0, 1.0]}))   # a layout outside the proof: not copied
    # dp4's second round was profiled again once, the machine 1.5 x slow around the attempt
    (work / "retries.json").write_text(json.dumps(
        {"dp4/r2": [{"speed": [60.0, 90.0], "load": [1.0, 1.0], "baseline": 60.0,
                     "kept": "profile_dp4_r2.disturbed1"}],
         "gone/r2": [{"speed": [1.0, 2.0], "load": [1.0, 1.0], "baseline": 1.0, "kept": "x"}]}))
    args = argparse.Namespace(proof=spec.PROOF, out=tmp_path / "run", work=work, reuse=True)
    bench.proof_run(args)
    run = tmp_path / "run"
    assert (run / "proof.toml").read_text() == spec.PROOF.read_text()
    assert (run / "calibration" / "four_rank.toml").is_file()
    assert "gone/r1" not in json.loads((run / "speed.json").read_text())
    t = json.loads((run / "table.json").read_text())
    assert {r["layout"]: r["load"] for r in t["sections"][0]["rows"]}["dp4"] == [0.5, 2.0]
    machine = {r["layout"]: r["machine"] for r in t["sections"][0]["rows"]}
    assert machine["dp4"] == pytest.approx([0.9, 1.5]) and machine["pp2dp2"] is None
    md = (run / "table.md").read_text()
    assert "| machine |" in md and "| 0.90-1.50 |" in md
    assert "gone/r2" not in json.loads((run / "retries.json").read_text())
    again = {r["layout"]: r.get("retried") for r in t["sections"][0]["rows"]}
    assert again["dp4"] == [{"round": 2, "slowed": 1.5}] and again["pp2dp2"] is None
    assert "Profiled again, the machine slow around the attempt" in md
    waited = {r["layout"]: r["measured"].get("waiting") for r in t["sections"][0]["rows"]}
    assert waited["dp4"] == pytest.approx(0.02) and waited["pp2dp2"] is None
    assert "| waiting for peers (ms) |" in md and "| 20 |" in md
    assert "dp4 round 2 (1.50)" in md
    check_run(run, tmp_path / "check")
    assert "4 ranks on 2 cores" in capsys.readouterr().out
    with pytest.raises(FileExistsError, match="run exists"):
        bench.proof_run(args)


def test_the_reference_gemm_times_the_machine():
    """The bench's speed reference (`reference_ms`) is a positive time and leaves the process's
    thread count as it found it."""
    import torch
    bench, threads = _bench(), torch.get_num_threads()
    assert bench.reference_ms(reps=1) > 0
    assert torch.get_num_threads() == threads


def test_a_profile_on_a_slowed_machine_is_taken_again_and_kept(tmp_path):
    """`profile` with a baseline: an attempt around which the reference GEMM took over
    `DISTURBED` x the baseline is moved aside (kept, with its log, listed in retries.json) and
    the layout profiled again, at most `RETRIES` times; the last attempt's figures are the
    round's. Without a baseline (the runs before the rule) the first attempt stands."""
    bench, work = _bench(), tmp_path
    layout = spec.load().layouts["dp2"]
    speeds = iter([[60.0, 75.0], [80.0, 60.0], [61.0, 59.0], [99.0, 99.0]])

    def once(work, layout, rnd, steps, out, log):
        out.mkdir()
        (out / "analysis.json").write_text("{}")
        log.write_text("profiled")
        return [1.0, 2.0], next(speeds)
    out = bench.profile(work, layout, 2, 4, baseline=60.0, once=once)
    assert out == work / "profile_dp2_r2" and out.is_dir()
    kept = sorted(p.name for p in work.glob("profile_dp2_r2.disturbed*"))
    assert kept == ["profile_dp2_r2.disturbed1", "profile_dp2_r2.disturbed1.log",
                    "profile_dp2_r2.disturbed2", "profile_dp2_r2.disturbed2.log"]
    tries = json.loads((work / "retries.json").read_text())["dp2/r2"]
    assert [t["speed"] for t in tries] == [[60.0, 75.0], [80.0, 60.0]]
    assert [t["kept"] for t in tries] == ["profile_dp2_r2.disturbed1", "profile_dp2_r2.disturbed2"]
    assert json.loads((work / "speed.json").read_text())["dp2/r2"] == [61.0, 59.0]
    # at most RETRIES: the third slow attempt is the round's
    speeds = iter([[99.0, 99.0]] * 3)
    bench.profile(work, layout, 3, 4, baseline=60.0, once=once)
    assert json.loads((work / "speed.json").read_text())["dp2/r3"] == [99.0, 99.0]
    assert len(json.loads((work / "retries.json").read_text())["dp2/r3"]) == bench.RETRIES
    # no baseline: never again; and a taken folder is never overwritten
    speeds = iter([[99.0, 99.0]])
    bench.profile(work, layout, 1, 4, once=once)
    assert "dp2/r1" not in json.loads((work / "retries.json").read_text())
    with pytest.raises(SystemExit, match="profile_dp2_r2"):
        bench.profile(work, layout, 2, 4, baseline=60.0, once=once)
    assert bench.disturbed([60.0, 69.0], 60.0) is False
    assert bench.disturbed([69.1, 60.0], 60.0) is True


def _bench():
    """bench/planner_vs_measured.py as a module (it is a script, not a package member)."""
    import importlib.util
    s = importlib.util.spec_from_file_location("pvm", ROOT / "bench" / "planner_vs_measured.py")
    assert s and s.loader
    bench = importlib.util.module_from_spec(s)
    s.loader.exec_module(bench)
    return bench


def test_committed_extra_folders_rederive(capsys):
    """Every committed `--extra` folder (docs/planner_proof/<folder>/extra.json: layouts chosen
    by someone else, predicted from a committed calibration) of the current model revision
    re-derives from its summaries, as `--derive FOLDER` does it, JSON and markdown; one of an
    earlier revision is refused (exit 2) and its markdown must be its JSON's (the two of
    2026-12-05T1200Z record no revision: revision 2 wrote them)."""
    from llama31_405b.planner.calibrate import MODEL_REVISION
    folders = sorted(p.parent for p in RUNS.glob("*/extra.json"))
    assert RUNS / "extra_2026-12-05T1200Z_two_rank" in folders
    bench = _bench()
    for folder in folders:
        t = json.loads((folder / "extra.json").read_text())
        if t.get("model_revision", 2) == MODEL_REVISION:
            assert bench.rederive_extra(folder) == 0, capsys.readouterr().out[-2000:]
        else:
            assert bench.rederive_extra(folder) == 2
            assert (folder / "extra.md").read_text() == render.extra_markdown(t), folder


def _pp2m8_profiled(tmp_path: Path) -> tuple[Path, Path]:
    """(a layouts file of one layout outside the proof, PP2 at 8 microbatches of 1, and a work
    folder holding three rounds of its synthetic profiles) for `--extra --reuse`."""
    from llama31_405b.config.load import load_config
    from llama31_405b.planner.calibrate.synthetic import synthetic_profile
    lfile = tmp_path / "extra.toml"
    lfile.write_text('[layouts.pp2m8]\nlabel = "PP2, 8 microbatches"\nbase = "tiny"\nranks = 2\n'
                     "tp = 1\npp = 2\nvp = 1\nminibs = 8\nmbs = 1\n")
    cfg = load_config(spec.committed_config(spec.load_layouts(lfile)["pp2m8"], tmp_path / "cfg"))
    work = tmp_path / "work"
    for r in range(1, 4):
        synthetic_profile(work / f"profile_pp2m8_r{r}", cfg, made_up())
    return lfile, work


def test_the_bench_writes_an_extra_folder_that_rederives(synthetic_run, tmp_path, capsys):
    """--extra --reuse on synthetic profiles of a layout outside the proof, predicted from the
    synthetic run's 2-rank calibration: the folder keeps the layouts file, the proof file, the
    given calibration and run.json, and re-derives; an edited extra.json is found, a folder of
    another model revision is not re-derived."""
    import argparse
    from llama31_405b.planner.calibrate import MODEL_REVISION
    bench = _bench()
    lfile, work = _pp2m8_profiled(tmp_path)
    out = tmp_path / "extra"
    seen = []  # the tree's state is read before the folder exists (its files are untracked)
    real = bench._commit
    bench._commit = lambda: seen.append(out.exists()) or {"commit": "c" * 40, "dirty": False}
    try:
        bench.extra(argparse.Namespace(proof=spec.PROOF, extra=lfile, out=out, work=work,
                                       reuse=True,
                                       calibration=synthetic_run / "calibration" / "two_rank.toml"))
    finally:
        bench._commit = real
    assert seen == [False] and json.loads((out / "run.json").read_text())["dirty"] is False
    assert (out / "layouts.toml").read_text() == lfile.read_text()
    assert (out / "proof.toml").read_text() == spec.PROOF.read_text()
    assert {"commit", "cpu_model", "load_before", "load_after"} <= set(
        json.loads((out / "run.json").read_text()))
    t = json.loads((out / "extra.json").read_text())
    assert t["model_revision"] == MODEL_REVISION and t["rows"][0]["layout"] == "pp2m8"
    assert bench.rederive_extra(out) == 0
    t["rows"][0]["measured"]["step"] *= 1.01
    (out / "extra.json").write_text(json.dumps(t))
    assert bench.rederive_extra(out) == 1
    assert "differs from" in capsys.readouterr().out
    t["model_revision"] = MODEL_REVISION + 1
    (out / "extra.json").write_text(json.dumps(t))
    assert bench.rederive_extra(out) == 2


def _tree(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_derive_with_another_calibration_predicts_an_extra_folder_and_writes_nothing(
        synthetic_run, tmp_path, capsys):
    """`--derive FOLDER --calibration CAL` (a diagnosis): the folder's measurements predicted
    from CAL, printed as such, the folder unchanged; the predictions are CAL's (a calibration
    with twice the host time per pass predicts a longer step); a calibration of another model
    revision, or a folder that is not an --extra one, exits 2."""
    import argparse
    from llama31_405b.planner.calibrate import MODEL_REVISION
    bench = _bench()
    lfile, work = _pp2m8_profiled(tmp_path)
    out, given = tmp_path / "extra", synthetic_run / "calibration" / "two_rank.toml"
    bench.extra(argparse.Namespace(proof=spec.PROOF, extra=lfile, out=out, work=work,
                                   reuse=True, calibration=given))
    other = tmp_path / "other.toml"
    text = given.read_text()
    line = next(x for x in text.splitlines() if x.startswith("host_s_per_layer_pass = "))
    value = float(line.split("= ")[1])
    other.write_text(text.replace(line, f"host_s_per_layer_pass = {2 * value!r}"))
    before = _tree(out)
    capsys.readouterr()
    assert bench.diagnose_extra(out, other) == 0
    printed = capsys.readouterr().out
    assert f"predicted from {other}" in printed and "A diagnosis" in printed
    assert _tree(out) == before
    committed = json.loads((out / "extra.json").read_text())["rows"][0]["predicted"]["step"]
    step = float(printed.split("| PP2, 8 microbatches | ")[1].split("(")[1].split(")")[0]) / 1e3
    assert step > committed * 1.01
    old = tmp_path / "old.toml"
    old.write_text(text.replace(f"model_revision = {MODEL_REVISION}",
                                f"model_revision = {MODEL_REVISION - 1}"))
    assert bench.diagnose_extra(out, old) == 2
    assert bench.diagnose_extra(synthetic_run, other) == 2
    assert _tree(out) == before


def test_extra_refuses_a_calibration_of_another_model_revision(synthetic_run, tmp_path):
    """A calibration from a run folder whose table another model revision derived reads its
    constants otherwise (revision 3 counts the time per pass per sequence): --extra refuses it,
    naming the revision, before anything is profiled or written."""
    import argparse
    from llama31_405b.planner.calibrate import MODEL_REVISION
    run = tmp_path / "old_run"
    (run / "calibration").mkdir(parents=True)
    shutil.copyfile(synthetic_run / "calibration" / "two_rank.toml",
                    run / "calibration" / "two_rank.toml")
    t = json.loads((synthetic_run / "table.json").read_text())
    (run / "table.json").write_text(json.dumps(t | {"model_revision": MODEL_REVISION - 1}))
    out = tmp_path / "extra"
    args = argparse.Namespace(proof=spec.PROOF, extra=ROOT / "bench" / "planner_extra" /
                              "2026-12-05T1215_two_rank.toml", out=out, work=tmp_path / "w",
                              reuse=True, calibration=run / "calibration" / "two_rank.toml")
    with pytest.raises(SystemExit, match=f"fitted by model revision {MODEL_REVISION - 1}"):
        _bench().extra(args)
    assert not out.exists()


def test_a_layout_sets_the_dp_overlap_and_the_bucket_over_its_base(tmp_path):
    """Model revision 19's fit layouts: `overlap` sets both of megatron-core's DP overlaps,
    `bucket` the DDP bucket size, in the config the bench profiles and the prediction reads;
    a layout without them keeps its base's; an unknown key is refused."""
    from llama31_405b.config.load import load_config
    lfile = tmp_path / "layouts.toml"
    lfile.write_text('[layouts.ov]\nbase = "tiny"\nranks = 2\ntp = 1\npp = 1\nvp = 1\nminibs = 2\n'
                     'mbs = 1\noverlap = true\nbucket = 32768\n\n'
                     '[layouts.plain]\nbase = "tiny"\nranks = 2\nminibs = 2\n')
    lay = spec.load_layouts(lfile)
    ov = load_config(spec.committed_config(lay["ov"], tmp_path / "ov")).performance
    assert ov.overlap_grad_reduce and ov.overlap_param_gather and ov.ddp_bucket_size == 32768
    plain = load_config(spec.committed_config(lay["plain"], tmp_path / "plain")).performance
    assert not plain.overlap_grad_reduce and plain.ddp_bucket_size is None
    lfile.write_text('[layouts.bad]\nbase = "tiny"\nranks = 2\noverlapp = true\n')
    with pytest.raises(ValueError, match="overlapp"):
        spec.load_layouts(lfile)
