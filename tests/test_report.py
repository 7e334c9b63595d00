"""`report` on the published v5.1 logs: a PNG and a summary that agree with the checkers."""
from mlperf_logs import LOGS, need_fixture

from llama31_405b.cli import main
from llama31_405b.mlperf.log import load_run
from llama31_405b.submission.report import summarize


def test_report_draws_the_real_runs(tmp_path, capsys):
    need_fixture()
    png = tmp_path / "report.png"
    assert main(["report", *map(str, LOGS), "--out", str(png), "--ruleset", "5.1.0"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    out = capsys.readouterr().out
    assert "256.333 min RCP-normalised" in out and f"report: {png}" in out


def test_summary_numbers():
    need_fixture()
    runs = [load_run(p) for p in LOGS]
    s = summarize(runs, "5.1.0")
    assert s.gbs == 576 and s.target == 5.6
    assert s.ref.kind == "below" and s.ref.mean == 313344
    assert [r[4] for r in s.rows] == [288000, 294912, 294912]
    assert abs(s.score - 241.2547) < 1e-3 and s.norm_factor == 1.0625
    src, pts = runs[0].step_times()
    assert src.startswith("tracked_stats") and len(pts) == 500


def test_block_timing_when_no_tracked_stats(tmp_path):
    need_fixture()
    p = tmp_path / "r.txt"
    p.write_text("".join(l for l in LOGS[0].read_text().splitlines(keepends=True)
                         if "tracked_stats" not in l))
    src, pts = load_run(p).step_times()
    assert src == "block timing" and len(pts) == 3
    assert all(27 < t < 29 for _, t in pts)    # ~27.7 s per step in this run


def test_mixed_batch_sizes_are_refused(tmp_path, capsys):
    need_fixture()
    from mlperf_logs import copy_logs, set_value
    logs = copy_logs(tmp_path)
    set_value(logs[1], "global_batch_size", 1152)
    assert main(["report", *map(str, logs), "--out", str(tmp_path / "x.png")]) == 2   # bad input
    assert "mix benchmarks or batch sizes" in capsys.readouterr().err


def test_demo_tail_prints_verdict_and_png(tmp_path, capsys):
    need_fixture()
    from llama31_405b.cli.report_cmd import verdict_and_report
    png = tmp_path / "demo.png"
    assert verdict_and_report([str(LOGS[0])], str(png)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("compliance: PASS") and out[-1] == f"report: {png}" and png.is_file()
