"""The MLPerf log writer: lines as mlperf_logging's MLLogger writes them; nothing buffered; the
first failed write raised once with the path and the cause; run_stop exactly once from any
number of threads, nothing after it."""
import io
import json
import logging
import os
import threading

import pytest

from llama31_405b.mlperf.log import load_run
from llama31_405b.mlperf.writer import LogWriteError, MLLogWriter


def _payload(line: str) -> dict:
    return json.loads(line.split(":::MLLOG ", 1)[1])


def test_lines_match_mlperf_loggings_own_logger():
    from mlperf_logging.mllog.mllog import MLLogger
    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    pylog = logging.getLogger("test_mlperf_writer")
    pylog.propagate, pylog.level = False, logging.INFO
    pylog.addHandler(Keep())
    ref = MLLogger(logger=pylog)
    out = io.StringIO()
    ours = MLLogWriter(None, echo=out)
    for call, key, value, meta in [("event", "seed", 12, None),
                                   ("start", "block_start", None, {"samples_count": 8}),
                                   ("event", "opt_base_learning_rate", 8e-5 * 1008 / 1152, None),
                                   ("end", "run_stop", None, {"status": "success"})]:
        getattr(ref, call)(key=key, value=value, metadata=meta, time_ms=1234)
        if key == "run_stop":
            ours.run_stop(meta)
        else:
            ours.write(key, value, meta)
    for theirs, mine in zip(lines, out.getvalue().splitlines(), strict=True):
        a, b = _payload(theirs), _payload(mine)
        assert list(a) == list(b) and list(a["metadata"]) == list(b["metadata"])
        for rec in (a, b):
            rec.pop("time_ms")
            rec["metadata"].pop("file"), rec["metadata"].pop("lineno")
        assert a == b
        assert mine.startswith(":::MLLOG {")


def test_every_line_is_in_the_file_at_once(tmp_path):
    path = tmp_path / "log.txt"
    w = MLLogWriter(path, echo=False)
    w.write("init_start")
    assert load_run(path).events[-1].key == "init_start"     # no buffer to flush


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_first_failed_write_raises_once_then_only_run_stop_is_tried():
    out = io.StringIO()
    w = MLLogWriter("/dev/full", echo=out)
    with pytest.raises(LogWriteError) as e:
        w.write("init_start")
    assert str(e.value) == ("cannot write the MLPerf log /dev/full: No space left on device "
                            "(ENOSPC)")
    assert w.write("init_stop") is False                     # dropped, not raised again
    assert w.run_stop({"status": "aborted"}) is True         # attempted, silently failing
    assert w.run_stop({"status": "aborted"}) is False
    keys = [_payload(ln)["key"] for ln in out.getvalue().splitlines()]
    assert keys == ["init_start", "run_stop"]                # the copy still ends properly


def test_run_stop_exactly_once_across_threads_and_nothing_after(tmp_path):
    path = tmp_path / "log.txt"
    w = MLLogWriter(path, echo=False)
    w.write("run_start")
    go = threading.Barrier(8)
    won = []

    def stop(i):
        go.wait()
        won.append(w.run_stop({"status": "aborted", "reason": f"thread {i}"}))

    threads = [threading.Thread(target=stop, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == [False] * 7 + [True]
    assert w.write("tracked_stats", {"train_loss": 1.0}) is False
    ev = load_run(path).events
    assert [e.key for e in ev] == ["run_start", "run_stop"]


def test_a_broken_echo_is_dropped_with_one_warning_when_the_file_is_the_log(tmp_path, capsys):
    echo = io.StringIO()
    echo.close()
    w = MLLogWriter(tmp_path / "log.txt", echo=echo)
    w.write("init_start")
    w.write("init_stop")
    assert capsys.readouterr().err.count("warning:") == 1
    assert [e.key for e in load_run(tmp_path / "log.txt").events] == ["init_start", "init_stop"]


def test_a_file_holding_mlperf_events_is_refused_and_kept(tmp_path):
    """A result file is never appended to: a log that holds events is refused when the writer
    is made (exit status 2 through failures.exit_code), naming the file; it stays byte for byte.
    An empty file (a launcher may create it) is taken."""
    from llama31_405b.failures import EXIT_INPUT, exit_code
    from llama31_405b.mlperf.writer import LogExistsError
    path = tmp_path / "result_0.txt"
    w = MLLogWriter(path, echo=False)
    w.write("init_start")
    w.run_stop({"status": "aborted"})
    w.close()
    before = path.read_bytes()
    with pytest.raises(LogExistsError, match=f"the MLPerf log {path} already holds MLPerf events"
                                             ".*pass a new --mlperf-log path") as e:
        MLLogWriter(path, echo=False)
    assert exit_code(e.value) == EXIT_INPUT
    from llama31_405b.failures import describe
    assert describe(e.value).startswith(f"the MLPerf log {path} already holds")
    assert path.read_bytes() == before
    empty = tmp_path / "empty.txt"
    empty.touch()
    w = MLLogWriter(empty, echo=False)
    w.write("init_start")
    w.close()
    assert [e.key for e in load_run(empty).events] == ["init_start"]
