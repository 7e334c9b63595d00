"""`submission package` on the published v5.1 logs: every checker passes; what they would refuse
is refused with the files named."""
import json

import pytest
from mlperf_logs import LOGS, ORG, SYSTEM_JSON, copy_logs, drop_key, line_of, need_fixture

from llama31_405b.cli import main
from llama31_405b.config import load_config
from llama31_405b.submission.package import PackageError, package, system_description


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    need_fixture()
    out = tmp_path_factory.mktemp("pkg")
    rc = main(["submission", "package", "--logs", str(LOGS[0].parent), "--org", ORG,
               "--out", str(out), "--ruleset", "5.1.0", "--system-desc", str(SYSTEM_JSON)])
    return rc, out


@pytest.mark.slow      # the package checker over three published logs (~40 s)
def test_real_logs_pass_every_checker(packaged, capsys):
    rc, out = packaged
    assert rc == 0
    org = out / ORG
    res = org / "results" / "hpg.dgxb200x8.n32" / "llama31_405b"
    assert sorted(p.name for p in res.glob("result_*.txt")) == [f"result_{i}.txt" for i in range(3)]
    assert json.loads((res / "scaling.json").read_text())["scaling_factor"] == 1.0625
    assert (org / "systems" / "hpg.dgxb200x8.n32.json").is_file()
    impl = org / "benchmarks" / "llama31_405b" / "implementations" / "megatron-core"
    assert (impl / "llama31_405b" / "submission" / "package.py").is_file()
    assert (impl / "configs" / "config_GB200_1024x4x16xtp4pp8cp2.toml").is_file()
    assert not list(impl.rglob("*.pyc")) and not (impl / ".venv").exists()
    log = (out / "package_checker.log").read_text()
    assert "PACKAGE CHECKER FOUND NO ERRORS" in log and "Skipping" not in log


@pytest.mark.slow
def test_score_matches_the_summarizer(packaged):
    _, out = packaged
    import csv
    with (out / "summary.csv").open() as f:
        row = next(csv.DictReader(f))
    assert float(row["llama31_405b"]) == pytest.approx(256.3331, abs=1e-3)


def test_two_logs_without_run_stop_are_refused_naming_them(tmp_path, capsys):
    need_fixture()
    logs = copy_logs(tmp_path / "logs")
    drop_key(logs[0], "run_stop")
    drop_key(logs[2], "run_stop")
    with pytest.raises(PackageError) as e:
        package(tmp_path / "logs", out=tmp_path / "out", org=ORG, system_desc=SYSTEM_JSON,
                ruleset="5.1.0")
    assert str(logs[0]) in str(e.value) and str(logs[2]) in str(e.value)
    assert str(logs[1]) not in str(e.value)
    rc = main(["submission", "package", "--logs", str(tmp_path / "logs"), "--org", ORG, "--out",
               str(tmp_path / "out"), "--ruleset", "5.1.0", "--system-desc", str(SYSTEM_JSON)])
    assert rc == 2   # refused input (docs/cli.md)
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no run_stop" in err


@pytest.mark.slow      # a whole package run (~40 s)
def test_one_failed_run_is_tolerated_as_the_checkers_do(tmp_path):
    need_fixture()
    logs = copy_logs(tmp_path / "logs")
    drop_key(logs[1], "run_stop")
    res = package(tmp_path / "logs", out=tmp_path / "out", org=ORG, system_desc=SYSTEM_JSON,
                  ruleset="5.1.0")
    assert res.ok, [s.line() for s in res.steps]
    assert any("result_1.txt" in w and "no run_stop" in w for w in res.warnings)
    assert res.score_min is not None


def test_generated_system_description_passes_the_checker(tmp_path):
    from mlperf_logging.system_desc_checker import system_desc_checker
    for name in ("config_GB200_2048x4x8xtp4pp8cp2.toml", "tiny_cpu.toml"):
        cfg = load_config(f"configs/{name}")
        desc = system_description(cfg, "reference")
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(desc))
        ok, *_ = system_desc_checker.check_system_desc(str(path), "training", "6.0.0")
        assert ok, desc
    assert desc["number_of_nodes"] == "1" and desc["submitter"] == "reference"
    gb = system_description(load_config("configs/config_GB200_2048x4x8xtp4pp8cp2.toml"), "x")
    assert gb["number_of_nodes"] == "2048" and gb["accelerators_per_node"] == "4"


@pytest.mark.parametrize("ruleset", ["5.1.0", "6.0.0"])
def test_rcp_decision_equals_the_checkers_own(ruleset):
    """rcp.check_runs (used for tiny runs, which the stock CLI cannot read) takes the same
    decision as mlperf_logging.rcp_checker.check_directory on real logs."""
    need_fixture()
    from mlperf_logging.rcp_checker import rcp_checker as rc

    from llama31_405b.mlperf.log import load_run
    from llama31_405b.submission.rcp import check_runs
    ours = check_runs([load_run(p) for p in LOGS], ruleset=ruleset)
    ok, msg, norm = rc.check_directory(str(LOGS[0].parent), "training", ruleset, False, False,
                                       rcp_pass="pruned_rcps")
    assert (ours.ok, ours.message, ours.norm_factor) == (ok, msg, pytest.approx(float(norm)))


def test_logs_that_do_not_match_the_config_are_refused(tmp_path):
    need_fixture()
    cfg = load_config("configs/config_GB200_1024x4x16xtp4pp8cp2.toml")
    with pytest.raises(PackageError, match="GBS 576, config .* GBS 1024"):
        package(LOGS[0].parent, out=tmp_path, org=ORG, cfg=cfg, ruleset="5.1.0")


def test_a_repeated_seed_is_refused(tmp_path):
    need_fixture()
    logs = copy_logs(tmp_path / "logs")
    from mlperf_logs import set_value
    set_value(logs[2], "seed", 30472)       # result_0's seed, same source line
    with pytest.raises(PackageError) as e:
        package(tmp_path / "logs", out=tmp_path / "out", org=ORG, system_desc=SYSTEM_JSON,
                ruleset="5.1.0")
    # the file's lines, and the metadata's source line said to be the logging script's
    line = lambda log: line_of(log, "seed")   # noqa: E731
    assert str(e.value) == (
        f"{logs[2]}:{line(logs[2])} logs seed 30472, as {logs[0]}:{line(logs[0])} does, both from "
        "the same source line of the logging script (/workspace/llm/pretrain.py:601, the event's "
        "metadata): every run needs its own seed")


def test_code_files_without_git_include_the_build_files(tmp_path):
    """Outside a git checkout the code directory still gets the files a submission is built and
    launched with (Dockerfile, run_and_time.sh), and nothing that does not exist."""
    from llama31_405b.submission.package import code_files
    for name in ("Dockerfile", "run_and_time.sh", "Makefile", "llama31_405b/cli/__init__.py",
                 "constraints/cpu.txt", "work_data/big.bin"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    names = {p.relative_to(tmp_path).as_posix() for p in code_files(tmp_path)}
    assert names == {"Dockerfile", "run_and_time.sh", "Makefile", "llama31_405b/cli/__init__.py",
                     "constraints/cpu.txt"}


def test_a_score_difference_is_explained_by_what_differs():
    """The summarizer's score differing from the package's is explained by the runs one counts
    and the other does not, or, when they count the same runs, said to be elsewhere; never
    'counting runs that did not converge (none)'."""
    need_fixture()
    from llama31_405b.mlperf.log import load_run
    from llama31_405b.submission.package import score_difference
    runs = [load_run(p) for p in LOGS]
    paths = {r.path for r in runs}
    assert score_difference(256.333, 256.3331, runs, paths) is None
    same = score_difference(256.940, 256.333, runs, paths)
    assert same == ("the result summarizer scores 256.940 min, the package 256.333 min, both "
                    "counting the same runs: the difference is in the runs' times or the RCP "
                    "normalisation (summary.csv, rcp_checker.log)")
    left_out = score_difference(250.0, 256.333, runs, paths - {str(LOGS[1])})
    assert left_out == ("the result summarizer scores 250.000 min, leaving out converged runs "
                        f"whose logs fail the compliance checker ({LOGS[1]}); the package's score "
                        "counts the converged runs: 256.333 min")


@pytest.mark.slow      # uses the package above
def test_a_second_package_into_the_same_tree_is_refused_and_keeps_the_first(packaged, capsys):
    """The first package's results stay byte for byte; the refusal comes before any checker."""
    rc, out = packaged
    assert rc == 0
    res = out / ORG / "results" / "hpg.dgxb200x8.n32" / "llama31_405b"
    before = {p.name: p.read_bytes() for p in res.iterdir()}
    rc2 = main(["submission", "package", "--logs", str(LOGS[0].parent), "--org", ORG,
                "--out", str(out), "--ruleset", "5.1.0", "--system-desc", str(SYSTEM_JSON)])
    assert rc2 == 2
    err = capsys.readouterr().err
    assert f"{res} already holds results" in err and "never replaced" in err
    assert {p.name: p.read_bytes() for p in res.iterdir()} == before


def test_a_tree_holding_other_systems_and_benchmarks_is_packaged_into_not_replaced(tmp_path):
    """refuse_earlier_package: another system's or benchmark's results beside this package's
    are no reason to refuse (and nothing removes them: assemble only adds); the same system
    described otherwise is."""
    from llama31_405b.submission.package import refuse_earlier_package
    other = tmp_path / "org" / "results" / "other_system" / "llama31_405b"
    other.mkdir(parents=True)
    (other / "result_0.txt").write_text("kept\n")
    (tmp_path / "org" / "results" / "sys" / "llama2_70b_lora").mkdir(parents=True)
    refuse_earlier_package(out=tmp_path, org="org", system="sys", desc={"a": 1},
                           benchmark="llama31_405b")
    (tmp_path / "org" / "systems").mkdir()
    (tmp_path / "org" / "systems" / "sys.json").write_text('{"a": 2}\n')
    with pytest.raises(PackageError, match="already describes system 'sys' otherwise"):
        refuse_earlier_package(out=tmp_path, org="org", system="sys", desc={"a": 1},
                               benchmark="llama31_405b")
    assert (other / "result_0.txt").read_text() == "kept\n"
