"""`compliance check` on real published logs, edited copies and broken files."""
from pathlib import Path

from mlperf_logs import LOGS, copy_logs, line_of, need_fixture, set_value

from llama31_405b.cli import main
from llama31_405b.mlperf.checker import check_log
from llama31_405b.mlperf.log import load_run, read_events


def test_real_logs_pass_ruleset_6_and_5_1():
    need_fixture()
    for ruleset in ("6.0.0", "5.1.0"):
        res = check_log(LOGS[0], ruleset=ruleset)
        assert res.ok, res.details()
        assert res.rule_files == [f"training_{ruleset}/{f}.yaml" for f in
                                  ("common", "closed_common", "closed_llama31_405b")]


def test_srun_prefixes_are_accepted():
    need_fixture()
    text = LOGS[0].read_text()
    assert "  0: :::MLLOG " in text          # the published log itself mixes prefixed lines
    run = load_run(LOGS[0])
    assert run.first("global_batch_size").value == 576
    assert run.status == "success" and abs(run.time_to_train_min - 235.8644) < 1e-3


def test_a_wrong_header_value_fails_naming_key_file_and_line(tmp_path):
    need_fixture()
    log = copy_logs(tmp_path)[0]
    set_value(log, "opt_base_learning_rate", 4.00000001e-05)
    res = check_log(log)
    assert not res.ok
    line = line_of(log, "opt_base_learning_rate")
    assert any(f"'opt_base_learning_rate' failed at {log}:{line}" in s for s in res.summary())


def test_tiny_logs_get_the_tiny_rules_automatically(tmp_path):
    need_fixture()
    log = copy_logs(tmp_path)[0]
    set_value(log, "submission_benchmark", "tiny_llama31")
    res = check_log(log)
    assert [Path(r).name for r in res.rule_files] == ["tiny_llama31.yaml"]
    # a real 405B log is no tiny run: the tiny values fail
    failed = "\n".join(res.summary())
    for key in ("max_sequence_length", "eval_samples", "opt_base_learning_rate"):
        assert f"'{key}'" in failed


def test_truncated_line_and_garbage_bytes_name_file_and_line(tmp_path, capsys):
    need_fixture()
    log = copy_logs(tmp_path)[0]
    raw = log.read_bytes().splitlines(keepends=True)
    raw[300] = raw[300][:200] + b"\xff\xfe\x00garbage" + raw[300][200:]
    raw[-1] = raw[-1][:90]                     # a run killed mid-line
    log.write_bytes(b"".join(raw))
    events, problems = read_events(log)
    where = sorted(p.lineno for p in problems)
    assert where == [301, len(raw)]
    assert "garbage bytes" in str(problems[0]) and "truncated" in str(problems[1])
    assert main(["compliance", "check", str(log)]) == 2   # the reader refuses it: bad input
    err = capsys.readouterr().err
    assert f"{log}:301" in err and err.startswith(f"error: refused: {log}:301")


def test_cli_one_verdict_line_per_log(capsys):
    need_fixture()
    assert main(["compliance", "check", *map(str, LOGS)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all(line.startswith("PASS ") for line in out)
