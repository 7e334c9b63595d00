"""One verdict on "did this run converge, and when" (mlperf.verdict) for every tool: `compliance
check`, `launch check-log` (run_and_time.sh's outcome line), `report` and `submission package`,
on edited copies of the published v5.1 logs."""
import pytest
from mlperf_logs import LOGS, ORG, SYSTEM_JSON, copy_logs, need_fixture, set_last_value

from llama31_405b.cli import main
from llama31_405b.mlperf.log import load_run
from llama31_405b.mlperf.verdict import convergence
from llama31_405b.submission.package import PackageResult, _agree_on_score, validate_runs
from llama31_405b.submission.rcp import olympic_score
from llama31_405b.submission.report import summarize


@pytest.fixture
def not_converged(tmp_path):
    """The three published logs; result_0's last evaluation edited to 5.61 (never <= 5.6) while
    its run_stop still says success."""
    need_fixture()
    logs = copy_logs(tmp_path / "logs")
    set_last_value(logs[0], "eval_accuracy", 5.61)
    return logs


def test_the_published_runs_converged_when_the_checkers_say():
    need_fixture()
    v = convergence(load_run(LOGS[0]))
    # RCP checker: samples of the last eval before run_stop; summarizer: run_start -> run_stop
    assert v.converged and v.samples == 288000 and v.minutes == pytest.approx(235.8644, abs=1e-3)
    assert v.describe().startswith("converged: 5.56899") and "235.864 min" in v.describe()


def test_success_without_an_eval_at_the_target_is_not_converged(not_converged):
    run = load_run(not_converged[0])
    v = convergence(run)
    assert run.status == "success" and not v.converged
    assert v.words == "not converged: best 5.61 > 5.6"
    assert run.samples_to_converge is None and run.outcome() == v.words


def test_compliance_check_and_check_log_say_not_converged(not_converged, capsys):
    log = str(not_converged[0])
    assert main(["compliance", "check", "--ruleset", "5.1.0", log]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"FAIL {log}") and "not converged: best 5.61 > 5.6" in err
    assert main(["launch", "check-log", "--config", "configs/config_GB200_1024x4x16xtp4pp8cp2.toml",
                 "--require-success", log]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"FAIL {log}: NOT compliant, run_stop status success, not converged: "
                          "best 5.61 > 5.6")


def test_report_marks_the_run_and_scores_without_it(not_converged):
    runs = [load_run(p) for p in not_converged]
    s = summarize(runs, "5.1.0")
    assert s.rows[0][2] == "not converged: best 5.61 > 5.6" and s.rows[0][3] is None
    others = [load_run(p).time_to_train_min for p in LOGS[1:]]
    assert s.score == pytest.approx(olympic_score([None, *others]))
    assert "not converged: best 5.61 > 5.6" in s.text()


def test_aborted_after_reaching_the_target_is_not_a_success(tmp_path, capsys):
    """The compliance checker's rules pass an aborted run_stop (common.yaml checks only that it
    has a status); the RCP checker counts it as not converged: so does every tool here."""
    need_fixture()
    log = copy_logs(tmp_path / "logs")[0]
    text = log.read_text().replace('"status": "success"',
                                   '"status": "aborted", "reason": "received SIGTERM"')
    log.write_text(text)
    v = convergence(load_run(log))
    assert not v.converged and v.words == "aborted (received SIGTERM)"
    assert main(["compliance", "check", "--ruleset", "5.1.0", str(log)]) == 1
    assert "the rules pass, but aborted (received SIGTERM)" in capsys.readouterr().err


def test_package_names_the_run_and_scores_converged_runs_only(not_converged, tmp_path):
    runs = [load_run(p) for p in not_converged]
    _, warnings = validate_runs(runs)
    assert any(str(not_converged[0]) in w and "best 5.61 > 5.6" in w for w in warnings)
    # the result summarizer would score a compliant aborted run; the package's score does not
    res = PackageResult(org_dir=tmp_path, benchmark="llama31_405b", system="s", score_min=999.0)
    _agree_on_score(res, runs, "5.1.0")
    others = [load_run(p).time_to_train_min for p in LOGS[1:]]
    assert res.score_min == pytest.approx(olympic_score([None, *others], 1.0625), abs=1e-3)
    assert any("counting runs that did not converge" in w for w in res.warnings)
