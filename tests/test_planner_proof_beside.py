"""A set of layouts profiled beside a proof run (bench/planner_vs_measured.py `--beside
SECTION=FILE`, issue 46's second acceptance point): in the run's own rounds, predicted from the
run's calibration of SECTION, reported apart in a folder of the --extra kind that re-derives.

Every figure is synthetic (`calibrate.synthetic.synthetic_profile` with the made-up constants of
tests/test_planner_proof.py): no measurement.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench.planner_proof import spec  # noqa: E402
from test_planner_proof import _bench, made_up  # noqa: E402

SET = ('[layouts.pp2m8]\nlabel = "PP2, 8 microbatches"\nbase = "tiny"\nranks = 2\ntp = 1\n'
       'pp = 2\nvp = 1\nminibs = 8\nmbs = 1\n')


def _args(tmp_path: Path, beside: list[str]) -> argparse.Namespace:
    return argparse.Namespace(proof=spec.PROOF, out=tmp_path / "run", work=tmp_path / "work",
                              reuse=True, beside=beside)


def test_a_set_beside_a_proof_run_is_refused_before_any_work(tmp_path):
    """A section the proof has not, a layout named as one of the proof's, a layout of another
    rank count than the section's unseen layouts (a set given to the wrong section) and a file
    that is not there are each refused, naming it; nothing is written."""
    bench, proof = _bench(), spec.load()
    good = tmp_path / "set.toml"
    good.write_text(SET)
    clash = tmp_path / "clash.toml"
    clash.write_text(SET.replace("pp2m8", "dp4"))
    for beside, says in ((["eight_rank=" + str(good)], "one of the proof's sections"),
                         ([str(good)], "give SECTION=FILE"),
                         (["two_rank=" + str(clash)], "'dp4' is already named"),
                         (["two_rank=" + str(good), "two_rank=" + str(good)],
                          "'pp2m8' is already named"),
                         (["four_rank=" + str(good)], "has 2 ranks, section four_rank"),
                         (["two_rank=" + str(tmp_path / "none.toml")], "none.toml")):
        with pytest.raises(SystemExit, match=says):
            bench.beside_sets(proof, beside)
        with pytest.raises(SystemExit, match=says):
            bench.proof_run(_args(tmp_path, beside))
        assert not (tmp_path / "run").exists()
    assert list(bench.beside_sets(proof, ["two_rank=" + str(good)])[0][2]) == ["pp2m8"]


def test_a_set_beside_a_proof_run_is_profiled_in_its_rounds_and_predicted_from_its_calibration(
        tmp_path, capsys):
    """`--beside two_rank=FILE --reuse` on synthetic profiles of the proof's layouts and the
    set's: the run's table holds the proof's layouts alone; the set's folder
    (extra_<run>_two_rank) holds its summaries, the run's two_rank calibration as the given one,
    and a report that names the run and re-derives (`--derive`); the tree's state is read before
    either folder gets a file. Without the set's profiles in the work folder the run stops
    naming the first (the set is profiled in the run's rounds, not after them)."""
    from llama31_405b.config.load import load_config
    from llama31_405b.planner.calibrate.synthetic import synthetic_profile
    bench, proof, work = _bench(), spec.load(), tmp_path / "work"
    lfile = tmp_path / "set.toml"
    lfile.write_text(SET)
    sets = {**proof.layouts, **spec.load_layouts(lfile)}
    for n in [*proof.profiled, "pp2m8"]:
        cfg = load_config(spec.committed_config(sets[n], tmp_path / "cfg" / n))
        for r in range(1, proof.rounds + 1):
            if n != "pp2m8":
                synthetic_profile(work / f"profile_{n}_r{r}", cfg, made_up())
    with pytest.raises(SystemExit, match="profile_pp2m8_r1"):
        bench.proof_run(argparse.Namespace(**vars(_args(tmp_path, ["two_rank=" + str(lfile)]))
                                           | {"out": tmp_path / "first"}))
    cfg = load_config(tmp_path / "cfg" / "pp2m8" / "config.toml")
    for r in range(1, proof.rounds + 1):
        synthetic_profile(work / f"profile_pp2m8_r{r}", cfg, made_up())
    (work / "speed.json").write_text(json.dumps({"pp2m8/r1": [60.0, 66.0],
                                                 "dp4/r1": [60.0, 60.0]}))
    seen: list[bool] = []
    run, folder = tmp_path / "run", tmp_path / "extra_run_two_rank"
    real = bench._commit
    bench._commit = lambda: seen.append(folder.exists() or run.exists()) or {
        "commit": "c" * 40, "dirty": False}
    try:
        bench.proof_run(_args(tmp_path, ["two_rank=" + str(lfile)]))
    finally:
        bench._commit = real
    assert seen == [False]
    table = json.loads((run / "table.json").read_text())
    assert "pp2m8" not in [r["layout"] for s in table["sections"] for r in s["rows"]]
    assert "pp2m8/r1" not in json.loads((run / "speed.json").read_text())
    t = json.loads((folder / "extra.json").read_text())
    cal = run / "calibration" / "two_rank.toml"
    assert t["beside"] == "run" and t["calibration"] == str(cal.resolve())
    assert [r["layout"] for r in t["rows"]] == ["pp2m8"]
    assert t["rows"][0]["machine"] == pytest.approx([60.0 / 63.0, 66.0 / 63.0])
    assert ((folder / "calibration" / "given.toml").read_bytes()
            == (run / "calibration" / "two_rank.toml").read_bytes())
    assert (folder / "layouts.toml").read_text() == SET
    assert (folder / "proof.toml").read_text() == spec.PROOF.read_text()
    info = json.loads((folder / "run.json").read_text())
    assert info["beside"] == "run" and info["dirty"] is False
    md = (folder / "extra.md").read_text()
    assert "profiled in the rounds of proof run run, beside its layouts" in md
    assert t["verdict"]["layouts"] == 1
    assert bench.rederive_extra(folder) == 0
    assert "Written: " + str(folder) in capsys.readouterr().out
    (tmp_path / "extra_again_two_rank").mkdir()   # a set's folder in the way: nothing made
    with pytest.raises(FileExistsError, match="extra_again_two_rank exists"):
        bench.proof_run(argparse.Namespace(**vars(_args(tmp_path, ["two_rank=" + str(lfile)]))
                                           | {"out": tmp_path / "again"}))
    assert not (tmp_path / "again").exists()
