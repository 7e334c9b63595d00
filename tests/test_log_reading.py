"""One reading of a result file (`mlperf.log.read_events`): a file that is not one run's log (two
runs appended, an event after run_stop, a damaged line where an event stood) is refused by every
tool that reads result files, with the same message naming the file and line."""
from __future__ import annotations

from pathlib import Path

import pytest
from mlperf_logs import FIXTURE, LOGS, ORG, SYSTEM_JSON, copy_logs, need_fixture

from llama31_405b.cli import main
from llama31_405b.mlperf.log import read_events

CONFIG = "configs/config_DGXB200_32x8x144xtp4pp8cp2.toml"


def _two_runs(d: Path) -> Path:
    """result_0.txt holds the published runs 0 and 1, appended (what `train --log` on an
    existing file used to make); result_1/2 are the published ones (distinct seeds)."""
    logs = copy_logs(d)
    logs[0].write_text(LOGS[0].read_text() + LOGS[1].read_text())
    return logs[0]


def _damaged(d: Path) -> Path:
    """result_0.txt with garbage over the `  0: :::MLLOG ` prefix of the converging evaluation
    (its last eval_accuracy, 5.56899)."""
    logs = copy_logs(d)
    lines = logs[0].read_bytes().splitlines(keepends=True)
    i = max(j for j, ln in enumerate(lines) if b'"key": "eval_accuracy"' in ln)
    assert b'"value": 5.56899' in lines[i]
    lines[i] = lines[i].replace(b"  0: :::MLLOG ", b"\x00\xff#@!garbage")
    logs[0].write_bytes(b"".join(lines))
    return logs[0]


def _line_of_second_run_start(log: Path) -> int:
    return [i for i, ln in enumerate(log.read_text().splitlines(), start=1)
            if '"key": "run_start"' in ln][1]


EDITS = {
    "two runs": (_two_runs, lambda log: (_line_of_second_run_start(log), "a second run_start")),
    "damaged line": (_damaged, lambda log: (
        next(i for i, ln in enumerate(log.read_bytes().splitlines(), start=1)
             if ln.startswith(b"\x00\xff#@!garbage")), "damaged MLLOG line")),
}


def _run(command: str, log: Path, tmp_path: Path) -> list[str]:
    d = str(log.parent)
    return {
        "compliance check": ["compliance", "check", str(log)],
        "report": ["report", *(str(p) for p in sorted(log.parent.glob("result_*.txt"))),
                   "--out", str(tmp_path / "report.png")],
        "submission package": ["submission", "package", "--logs", d, "--org", ORG, "--out",
                               str(tmp_path / "pkg"), "--ruleset", "5.1.0",
                               "--system-desc", str(SYSTEM_JSON)],
        "launch check-log": ["launch", "check-log", "--config", CONFIG, "--require-success",
                             str(log)],
    }[command]


# bad input (docs/cli.md): 2, except for `launch check-log`, whose verdict line run_and_time.sh
# keeps as the run's outcome: FAIL and 1 (4 when the log also lacks run_stop: a killed run)
STATUS = {"compliance check": 2, "report": 2, "submission package": 2, "launch check-log": 1}


@pytest.mark.parametrize("edit", list(EDITS))
@pytest.mark.parametrize("command", list(STATUS))
def test_every_tool_refuses_the_file_with_the_reader_s_message(edit, command, tmp_path, capsys):
    need_fixture()
    make, where = EDITS[edit]
    log = make(tmp_path / "logs")
    lineno, what = where(log)
    (problem,) = [p for p in read_events(log)[1]]
    assert problem.lineno == lineno and problem.message.startswith(what)
    rc = main(_run(command, log, tmp_path))
    out = capsys.readouterr()
    assert rc == STATUS[command], out.out + out.err
    assert str(problem) in out.out + out.err        # the same message: file, line, what
    if command == "launch check-log":   # no run_stop status, no convergence from such a file
        assert out.out.startswith(f"FAIL {log}: NOT compliant, not one run's log (the reader "
                                  f"refused it) -- {problem}")
    assert not (tmp_path / "report.png").exists()
    assert not (tmp_path / "pkg" / ORG).exists()


def test_the_second_run_start_names_the_first_and_the_run_stop(tmp_path):
    need_fixture()
    log = _two_runs(tmp_path)
    (p,) = read_events(log)[1]
    first_stop = next(i for i, ln in enumerate(log.read_text().splitlines(), start=1)
                      if '"key": "run_stop"' in ln)
    assert f"the first run's run_stop is at line {first_stop}" in p.message
    assert "this file holds 2 runs" in p.message


def test_an_event_after_run_stop_is_named(tmp_path):
    need_fixture()
    log = copy_logs(tmp_path)[0]
    lines = log.read_text().splitlines(keepends=True)
    stop = next(i for i, ln in enumerate(lines) if '"key": "run_stop"' in ln)
    tracked = next(ln for ln in lines if '"key": "tracked_stats"' in ln)
    log.write_text("".join(lines) + tracked + tracked)
    (p,) = read_events(log)[1]
    assert p.lineno == len(lines) + 1
    assert p.message == (f"'tracked_stats' after run_stop (line {stop + 1}): nothing follows "
                         "run_stop in a result file (2 event(s) do here)")


def test_published_logs_and_other_console_lines_read_clean(tmp_path):
    """Every published log reads without a problem; console lines that are not events (no MLLOG,
    no event JSON keys) are skipped, not reported."""
    need_fixture()
    for p in sorted(FIXTURE.parent.rglob("*.txt")):
        assert read_events(p)[1] == [], p
    log = copy_logs(tmp_path)[0]
    log.write_text("+ srun -l python pretrain.py\n[rank0] step 1 loss 12.3 {'lr': 1e-05}\n\n"
                   + log.read_text())
    events, problems = read_events(log)
    assert problems == [] and len(events) == len(read_events(LOGS[0])[0])


def test_a_json_error_reads_once(tmp_path):
    log = tmp_path / "r.txt"
    log.write_text(':::MLLOG {"namespace": "", "key": "run_start", "value": "unterminated\n')
    (p,) = read_events(log)[1]
    assert p.message.startswith("truncated MLLOG line (Unterminated string starting at column ")
    assert "at at" not in p.message
