"""Every command of `python -m llama31_405b` ends a missing or an invalid input the way docs/cli.md
says: exit status 2, and stderr ending with exactly one `error:` line (continued only by indented
lines) that names the file or the key. In-process calls of `cli.main`; nothing trains (`train` on
a missing config fails before any work). The last test keeps the table complete: a new command
or action must be added here, or listed with why it takes no input."""
from __future__ import annotations

import argparse

import pytest

from conftest import REPO
from llama31_405b.cli import build_parser, main

TINY = str(REPO / "configs" / "tiny_cpu.toml")

# {mc}/{bc}: a missing / an invalid config, {ml}/{bl}: a missing / an invalid MLPerf log,
# {md}: a missing folder, {t}: a scratch folder, {tiny}: the valid tiny config. Each case:
# (command as --help lists it, argv with a missing input, argv with an invalid one)
CASES = [
    ("config check", "config check {mc}", "config check {bc}"),
    ("config show", "config show {mc}", "config show {bc}"),
    ("compliance precheck", "compliance precheck {mc}", "compliance precheck {bc}"),
    ("compliance check", "compliance check {ml}", "compliance check {bl}"),
    ("compliance tiny-rcp", "compliance tiny-rcp {ml} --out {t}/r.json",
     "compliance tiny-rcp {bl} --out {t}/r.json"),
    ("submission package", "submission package --logs {md} --config {tiny} --org o --out {t}/p",
     "submission package --logs {t} --config {bc} --org o --out {t}/p"),
    ("report", "report {ml} --out {t}/r.png", "report {bl} --out {t}/r.png"),
    ("launch env", "launch env {mc}", "launch env {bc}"),
    ("launch preflight", "launch preflight --config {mc}", "launch preflight --config {bc}"),
    ("launch check-log", "launch check-log --config {mc} {bl}",
     "launch check-log --config {bc} {bl}"),
    ("launch hostnames", None, "launch hostnames gb-r[001-"),
    ("data verify", "data verify {mc}", "data verify {bc}"),
    ("data prepare", "data prepare --config {mc} --raw-dir {t}",
     "data prepare --config {bc} --raw-dir {t}"),
    ("train", "train --config {mc}", "train --config {bc}"),
    ("train-init", "train-init --config {mc}", "train-init --config {bc}"),
    ("first-contact", "first-contact --config {mc}", "first-contact --config {bc}"),
    ("plan", "plan --config {mc}", "plan --config {bc}"),
    ("profile", "profile {mc}", "profile {bc}"),
    ("profile", "profile --analyze {md}", None),
    ("rehearse", "rehearse {mc}", "rehearse {bc}"),
    ("checkpoint convert", "checkpoint convert --hf {md} --config {tiny} --out {t}/c",
     "checkpoint convert --hf {md} --config {bc} --out {t}/c"),
    ("checkpoint verify", "checkpoint verify --hf {md} --megatron {md} --config {mc}",
     "checkpoint verify --hf {md} --megatron {md} --config {bc}"),
    ("demo", "demo --config {mc}", "demo --config {bc}"),
]
NO_INPUT = {
    "compliance tiny-rules": "prints (or --write: writes) the project's own rules file",
    "launch hostlist": "any host names make a hostlist",
    "data tiny": "builds the tiny data into a folder it creates (work, not a check of input)",
}
"""Actions with no input that could be missing or invalid."""


def _params():
    out = []
    for command, missing, invalid in CASES:
        for kind, argv in (("missing", missing), ("invalid", invalid)):
            if argv:
                out.append(pytest.param(argv, kind, id=f"{command}-{kind}"))
    return out


@pytest.fixture
def inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                     # `demo` changes into the repository
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # `checkpoint convert` sets it for itself
    bad_cfg = tmp_path / "bad.toml"                 # a key the schema does not have
    bad_cfg.write_text(f'base = "{TINY}"\n[batch]\nminbs = 8\n')
    bad_log = tmp_path / "result_0.txt"             # an MLLOG line that is not JSON
    bad_log.write_text(':::MLLOG {"key": "run_start", "value": null\n')
    return {"mc": tmp_path / "missing.toml", "bc": bad_cfg, "ml": tmp_path / "missing.txt",
            "bl": bad_log, "md": tmp_path / "missing_dir", "t": tmp_path, "tiny": TINY}


def run(capsys, argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:          # argparse, sys.exit
        rc = e.code
    return rc, capsys.readouterr().err


def assert_one_error_line(err: str, *names: str) -> str:
    """stderr ends with one `error:` line, continued only by indented lines, that names each of
    `names`; returns it."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    heads = [i for i, ln in enumerate(lines) if ln.startswith("error:")]
    assert len(heads) == 1, err
    assert all(ln.startswith(" ") for ln in lines[heads[0] + 1:]), err
    message = "\n".join(lines[heads[0]:])
    assert all(n in message for n in names), (names, message)
    return message


@pytest.mark.parametrize("template,kind", _params())
def test_missing_and_invalid_input_exit_2_with_one_error_line(capsys, inputs, template, kind):
    argv = [a.format(**inputs) for a in template.split()]
    rc, err = run(capsys, argv)
    assert rc == 2, err
    # the input at fault: a config before a log or folder (each command reads its config first);
    # the invalid config is named with its bad key
    at_fault = next((k for k in ("mc", "bc", "ml", "bl", "md") if f"{{{k}}}" in template), None)
    names = ([str(inputs[at_fault])] + (["batch.minbs"] if at_fault == "bc" else [])
             if at_fault else [argv[-1]])
    assert_one_error_line(err, *names)


def test_several_configs_one_error_line_each(capsys, inputs):
    """`config check` goes on after a bad config: one `error:` line per bad one, status 2."""
    rc, err = run(capsys, ["config", "check", str(inputs["mc"]), TINY, str(inputs["bc"])])
    assert rc == 2
    heads = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(heads) == 2 and str(inputs["mc"]) in heads[0] and "batch.minbs" in heads[1]


def test_usage_errors_end_with_one_error_line(capsys):
    rc, err = run(capsys, ["config", "check"])
    assert rc == 2
    assert assert_one_error_line(err, "PATH").startswith(
        "error: python -m llama31_405b config check: the following arguments are required")
    rc, err = run(capsys, ["launch", "env", TINY, "--runs", "two"])
    assert rc == 2 and "--runs" in assert_one_error_line(err, "--runs")


def test_check_log_counts_a_missing_result_log_as_a_run_without_run_stop(capsys, inputs):
    """`launch check-log` judges result files for run_and_time.sh: a missing one is a run that
    wrote no log (status 4, its line on stdout), not bad input (docs/cli.md)."""
    capsys.readouterr()
    rc = main(["launch", "check-log", "--config", TINY, str(inputs["ml"])])
    out = capsys.readouterr().out
    assert rc == 4 and out.startswith(f"FAIL {inputs['ml']}")


def _actions(parser: argparse.ArgumentParser, prefix: str = ""):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix
        return
    for name, sub in subs[0].choices.items():
        yield from _actions(sub, f"{prefix} {name}".strip())


def test_every_command_is_covered():
    """Every command and action `python -m llama31_405b --help` lists has its cases above (or
    says why it has no input), and the docs' table lists it."""
    covered = {c for c, *_ in CASES} | set(NO_INPUT)
    listed = set(_actions(build_parser()))
    assert listed - covered == set(), "add these commands to CASES (or NO_INPUT, with why)"
    assert covered - listed == set()
    table = (REPO / "docs" / "cli.md").read_text()
    missing = [c for c in sorted(listed) if f"`{c}" not in table]
    assert missing == [], "docs/cli.md's exit status table does not list these"
