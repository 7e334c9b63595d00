"""issue 45 item 7: `submission package --out <relative path>` resolves the path once, against the
working folder (the checkers run with the tree's folder as theirs: a relative path joined twice
made them fail with tracebacks)."""
import shutil

import pytest
from mlperf_logs import LOGS, ORG, SYSTEM_JSON, need_fixture

from llama31_405b.cli import main


def test_the_rcp_checker_of_a_relative_results_folder_passes(tmp_path, monkeypatch):
    """The published logs under a relative results folder: the RCP checker (a subprocess in the
    tree's folder) finds them and writes its log beside the tree, not under <cwd>/rel/rel."""
    from llama31_405b.submission.package import run_rcp_checker
    need_fixture()
    res = tmp_path / "relpkg" / ORG / "results" / "sys" / "llama31_405b"
    res.mkdir(parents=True)
    for p in LOGS:
        shutil.copyfile(p, res / p.name)
    monkeypatch.chdir(tmp_path)
    step = run_rcp_checker(res.relative_to(tmp_path), "5.1.0")
    assert step.ok, step.line()
    assert (tmp_path / "relpkg" / "rcp_checker.log").is_file()
    assert not (tmp_path / "relpkg" / "relpkg").exists()


@pytest.mark.slow      # a whole package run (~40 s)
def test_a_relative_out_packages_as_an_absolute_one(tmp_path, monkeypatch, capsys):
    need_fixture()
    monkeypatch.chdir(tmp_path)
    rc = main(["submission", "package", "--logs", str(LOGS[0].parent), "--org", ORG,
               "--out", "relpkg", "--ruleset", "5.1.0", "--system-desc", str(SYSTEM_JSON)])
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err
    assert "Traceback" not in out.out + out.err and "verdict: PASS" in out.out
    assert "score: 256.333 minutes" in out.out
    for name in ("package_checker.log", "rcp_checker.log", "summary.csv"):
        assert (tmp_path / "relpkg" / name).is_file(), name
    assert not (tmp_path / "relpkg" / "relpkg").exists()


def test_demo_reads_a_relative_config_from_the_working_folder(tmp_path, monkeypatch, capsys):
    """`demo` moves into the repository to run its commands: a relative --config is the
    working folder's (an invalid one here, refused before any work), not the repository's."""
    from llama31_405b.cli.demo_cmd import REPO
    (tmp_path / "mine.toml").write_text(f'base = "{REPO / "configs" / "tiny_cpu.toml"}"\n'
                                        "[run]\nnum_runs = 0\n")
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--config", "mine.toml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path}/mine.toml: invalid config:"), err
    assert "run.num_runs must be >= 1" in err
