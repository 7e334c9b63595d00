"""Issue 45, items 1-6: no command replaces or deletes an earlier result, two writers of one
result cannot both proceed, and runs of different submitters are not scored together. Each test
fails without its fix (the earlier code deleted, rewrote or appended)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, py_env
from llama31_405b import outputs
from mlperf_logs import LOGS, copy_logs, need_fixture, set_value

GB200 = "configs/config_GB200_2048x4x8xtp4pp8cp2.toml"


# -- 1. profiles ----------------------------------------------------------------------------------
def _profile(out: Path):
    from llama31_405b.config import load_config
    from llama31_405b.profile.capture import Plan
    from llama31_405b.profile.marker import mark_folder
    mark_folder(out, load_config(REPO / "configs" / "tiny_cpu.toml"), Plan(out=out))


def test_a_second_profile_into_a_folder_keeps_the_first(tmp_path):
    from llama31_405b.profile.marker import unusable
    out = tmp_path / "prof"
    _profile(out)
    for name in ("ranks/rank00000.json", "traces/rank00000.meta.json", "analysis.json"):
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text("{}")
    assert "holds an earlier profile (profile.json), kept" in unusable(out)
    with pytest.raises(outputs.OutputExists, match="NOT_AN_MLPERF_RUN.txt already exists"):
        _profile(out)
    assert all((out / n).read_text() == "{}" for n in
               ("ranks/rank00000.json", "traces/rank00000.meta.json", "analysis.json"))


def test_profile_without_out_takes_a_new_folder(tmp_path, monkeypatch, capsys):
    from llama31_405b.cli.profile_cmd import _out_folder
    from llama31_405b.parallel.distributed import dist_env_from_environ
    monkeypatch.chdir(tmp_path)
    de = dist_env_from_environ({})
    first, second = _out_folder(None, "tiny_cpu", de), _out_folder(None, "tiny_cpu", de)
    assert (first, second) == (Path("out/profile/tiny_cpu"), Path("out/profile/tiny_cpu-2"))
    assert "[profile] output folder: out/profile/tiny_cpu-2 (new" in capsys.readouterr().err


def test_run_and_time_refuses_a_logdir_holding_a_profile(tmp_path):
    logdir = tmp_path / "prof"
    _profile(logdir)
    env = {**py_env(), "CONFIG": "configs/tiny_cpu.toml", "LOGDIR": str(logdir), "PROFILE": "1",
           "DRY_RUN": "1"}
    r = subprocess.run(["bash", "run_and_time.sh"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "already holds an earlier campaign's files (NOT_AN_MLPERF_RUN.txt profile.json)" \
        in " ".join(r.stderr.split())


# -- 2. submission trees --------------------------------------------------------------------------
def test_code_of_an_earlier_package_is_not_replaced(tmp_path):
    from llama31_405b.submission.package import PackageError, refuse_other_code
    impl = tmp_path / "org" / "benchmarks" / "llama31_405b" / "implementations" / "megatron-core"
    impl.mkdir(parents=True)
    (impl / "README.md").write_text("the first system's code\n")
    with pytest.raises(PackageError, match=r"holds the code of an earlier package, not this "
                       r"checkout's \(.* is new in this checkout\)"):
        refuse_other_code(impl)
    assert (impl / "README.md").read_text() == "the first system's code\n"


def test_each_package_gets_its_own_checker_logs(tmp_path):
    from llama31_405b.submission.package import claim_check_files
    first = claim_check_files(tmp_path)
    first["package"].write_text("first package's verdict")
    second = claim_check_files(tmp_path)
    assert [p.name for p in second.values()] == ["package_checker-2.log", "rcp_checker-2.log",
                                                 "summary-2.csv", "summary-2.json"]
    assert first["package"].read_text() == "first package's verdict"


def test_two_packages_of_one_system_at_once_one_is_refused(tmp_path, monkeypatch):
    from llama31_405b.mlperf.log import load_run
    from llama31_405b.submission.package import PackageError, assemble
    need_fixture()
    runs = [load_run(p) for p in LOGS]
    org = tmp_path / "org"
    impl = org / "benchmarks" / "b" / "implementations" / "i"
    impl.parent.mkdir(parents=True)
    impl.mkdir()    # the code part is not under test here: this checkout's code, pre-placed
    kw = dict(out=tmp_path, org="org", system="sys", desc={"a": 1}, benchmark="b", impl="i")
    import llama31_405b.submission.package as pkg
    # both passed refuse_earlier_package; the first then published its results
    res = org / "results" / "sys" / "b"
    res.mkdir(parents=True)
    (res / "result_0.txt").write_text("the first package's")
    # the race: the checks passed earlier (monkeypatch puts them back; a reload would give the
    # module new exception classes that other tests' imports no longer match)
    monkeypatch.setattr(pkg, "refuse_earlier_package", lambda **k: None)
    monkeypatch.setattr(pkg, "refuse_other_code", lambda d: None)
    with pytest.raises(PackageError, match="already exists, kept"):
        assemble(runs, **kw)
    assert sorted(p.name for p in res.iterdir()) == ["result_0.txt"]
    assert (res / "result_0.txt").read_text() == "the first package's"


# -- 3. verdicts and pictures ---------------------------------------------------------------------
def test_check_log_keeps_an_earlier_verdict(tmp_path, capsys):
    need_fixture()
    from llama31_405b.launch.logcheck import check_log
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "result_0.compliance.log").write_text("the earlier verdict\n")
    check_log(LOGS[0], "llama31_405b", reports)
    assert (reports / "result_0.compliance.log").read_text() == "the earlier verdict\n"
    assert "outcome:" in (reports / "result_0.compliance-2.log").read_text()
    assert "this verdict: " + str(reports / "result_0.compliance-2.log") in capsys.readouterr().err


def test_analysis_next_to_an_earlier_one(tmp_path):
    from llama31_405b.profile.report import _claim_outputs
    (tmp_path / "analysis.json").write_text("the calibration's input")
    paths = _claim_outputs(tmp_path, "{}")
    assert [p.name for p in paths] == ["analysis-2.json", "analysis-2.txt", "breakdown-2.png"]
    assert (tmp_path / "analysis.json").read_text() == "the calibration's input"


def test_report_out_is_never_replaced(tmp_path, capsys, monkeypatch):
    need_fixture()
    from llama31_405b.cli import main
    png = tmp_path / "mine.png"
    png.write_bytes(b"earlier")
    assert main(["report", str(LOGS[0]), "--out", str(png)]) == 2
    assert "mine.png already exists, kept" in capsys.readouterr().err
    assert png.read_bytes() == b"earlier"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "report.png").write_bytes(b"earlier")      # the default path taken
    assert main(["report", str(LOGS[0]), "--ruleset", "5.1.0"]) == 0
    assert "report: report-2.png" in capsys.readouterr().out
    assert (tmp_path / "report.png").read_bytes() == b"earlier"


def test_plan_explain_png_is_never_replaced(tmp_path):
    from llama31_405b.planner.explain import plot
    png = tmp_path / "planner_scaling.png"
    png.write_bytes(b"earlier")
    from llama31_405b.planner.explain import PUBLISHED_MIN  # noqa: F401 (the module's data)
    with pytest.raises(outputs.OutputExists):
        plot([], png)                          # no rows: a plot all the same
    assert png.read_bytes() == b"earlier"
    assert plot([], png, unique=True).name == "planner_scaling-2.png"


# -- 4. checkpoints -------------------------------------------------------------------------------
@pytest.mark.slow
def test_an_interrupted_force_save_leaves_the_earlier_checkpoint_whole(tmp_path, monkeypatch):
    """One gloo rank, the tiny model: a save interrupted half-way (the second save's first file
    written, then an error) leaves the first checkpoint exactly as it was; a finished second save
    replaces nothing: the first is kept as <name>.earlier."""
    import socket

    from megatron.core import dist_checkpointing

    from llama31_405b.checkpoint import format as ckpt_format
    from llama31_405b.config import load_config
    from llama31_405b.model.builder import build_model
    from llama31_405b.parallel.distributed import DistEnv
    from llama31_405b.parallel.setup import seed_model_parallel, setup_parallel, teardown_parallel
    from helpers.ports import free_port
    cfg = load_config("configs/tiny_cpu.toml")
    setup_parallel(cfg, DistEnv(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1",
                                master_port=free_port(), hostname=socket.gethostname(),
                                launcher="single"))
    ck = tmp_path / "init"
    try:
        seed_model_parallel(1)
        chunks = build_model(cfg)
        ckpt_format.save(chunks, ck, cfg)
        before = {p.name: p.read_bytes() for p in ck.iterdir()}
        real = dist_checkpointing.save

        def interrupted(state, where):
            (Path(where) / "__0_0.distcp").write_bytes(b"half of a new tensor file")
            raise KeyboardInterrupt
        monkeypatch.setattr(dist_checkpointing, "save", interrupted)
        with pytest.raises(KeyboardInterrupt):
            ckpt_format.save(chunks, ck, cfg)
        assert {p.name: p.read_bytes() for p in ck.iterdir()} == before
        monkeypatch.setattr(dist_checkpointing, "save", real)
        ckpt_format.save(chunks, ck, cfg)
    finally:
        teardown_parallel()
    assert ckpt_format.is_complete(ck) and ckpt_format.is_complete(tmp_path / "init.earlier")
    assert {p.name: p.read_bytes() for p in (tmp_path / "init.earlier").iterdir()} == before


# -- 5. writes that race --------------------------------------------------------------------------
def test_two_writers_of_one_mlperf_log_the_second_is_refused(tmp_path):
    from llama31_405b.mlperf.writer import LogExistsError, MLLogWriter
    log = tmp_path / "result_0.txt"
    a = MLLogWriter(str(log), echo=False)
    b = MLLogWriter(str(log), echo=False)     # both made before either wrote (the race)
    a.write("init_start")
    with pytest.raises(LogExistsError, match="being written by another run"):
        b.write("init_start")
    a.write("init_stop")
    a.close()
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and all(":::MLLOG" in ln for ln in lines)
    c = MLLogWriter(str(tmp_path / "r1.txt"), echo=False)
    (tmp_path / "r1.txt").write_text(':::MLLOG {"key": "init_start"}\n')  # another run's, meanwhile
    with pytest.raises(LogExistsError, match="already holds MLPerf events"):
        c.write("init_start")


# -- 6. mixed submitters --------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["submission_org", "submission_platform", "submission_division"])
def test_report_refuses_mixed_submitters(tmp_path, capsys, key):
    need_fixture()
    from llama31_405b.cli import main
    logs = copy_logs(tmp_path)
    set_value(logs[1], key, "other")
    assert main(["report", *map(str, logs), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert f"the logs mix {key.removeprefix('submission_')}s: " in err and "'other'" in err
    assert not (tmp_path / "x.png").exists()


# -- 2, the two parts the package tests above do not reach -----------------------------------------
def test_an_implementation_folder_with_a_changed_file_is_not_this_checkouts_code(tmp_path):
    """The same file names as this checkout's code, one file's bytes changed: refused as
    another package's code (submission.package.code_differs), where the same bytes pass."""
    from llama31_405b.submission.package import code_differs, code_files
    root = tmp_path / "checkout"
    for name in ("Dockerfile", "run_and_time.sh", "llama31_405b/cli/__init__.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n")
    impl = tmp_path / "impl"
    for f in code_files(root):
        rel = f.relative_to(root)
        (impl / rel).parent.mkdir(parents=True, exist_ok=True)
        (impl / rel).write_bytes(f.read_bytes())
    assert code_differs(impl, root) is None
    (impl / "run_and_time.sh").write_text("# an earlier version\n")
    assert code_differs(impl, root) == "run_and_time.sh differs"


def test_with_two_systems_in_the_tree_the_score_is_this_systems(tmp_path, monkeypatch):
    """The summarizer's CSV of a tree holding two systems of one benchmark: the score is read
    from the row of this package's system, not the first row. The summarizer itself is run by
    the package tests; here its CSV (its columns: system, then one per benchmark) is written in
    its place, so that two systems need not be packaged."""
    import llama31_405b.submission.package as pkg

    def summarizer(args, cwd):
        csv = Path(args[args.index("--csv") + 1])
        csv.write_text("division,system,llama31_405b\nclosed,other.system,111.5\n"
                       "closed,hpg.dgxb200x8.n32,256.333\n")
        return 0, ""

    monkeypatch.setattr(pkg, "_run", summarizer)
    org = tmp_path / "org"
    org.mkdir()
    step, score = pkg.run_summarizer(org, "llama31_405b", "5.1.0", system_name="hpg.dgxb200x8.n32")
    assert score == 256.333 and step.ok, step
    _, none = pkg.run_summarizer(org, "llama31_405b", "5.1.0", out_csv=tmp_path / "s2.csv",
                                 system_name="not.in.the.tree")
    assert none is None                   # not this system's row: no score rather than another's
