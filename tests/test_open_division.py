"""An open-division tiny run is checked with the open division's rules: `compliance precheck`,
`compliance check` and `launch check-log` (by the config's run.division) pass it; the closed
rules, which require submission_division "closed", are no longer applied to it."""
from __future__ import annotations

import ast

from llama31_405b.cli import main
from llama31_405b.config import load_config
from llama31_405b.config.rules import LLAMA31_405B
from llama31_405b.mlperf import header_events
from llama31_405b.submission import tiny_rules
from llama31_405b.submission.precheck import log_lines, precheck_config

TINY = "configs/tiny_cpu.toml"


def _log(tmp_path, division: str):
    cfg = load_config(TINY, overrides={"run": {"division": division}})
    path = tmp_path / f"{division}.txt"
    path.write_text("\n".join(log_lines(header_events(cfg, seed=1), cfg)) + "\n")
    return cfg, path


def test_committed_open_rules_file_is_current():
    path = tiny_rules.TINY_RULES_FILES["open"]
    assert path.read_text() == tiny_rules.render_tiny_rules(division="open"), (
        f"{path} is stale: run `python -m llama31_405b compliance tiny-rules --write`")
    assert "v['value'] == 'open'" in path.read_text()


def test_open_formulas_reproduce_the_packages_open_llama31_405b_rules():
    ours = {r["NAME"]: r for r in tiny_rules.open_benchmark_records(LLAMA31_405B)}
    stock = {i["KEY"]["NAME"]: i["KEY"] for i in tiny_rules.package_rules("open_llama31_405b.yaml")}
    assert set(ours) == set(stock)
    for name, rec in stock.items():
        assert ours[name]["REQ"] == rec["REQ"]
        for field in ("CHECK", "POST", "ATLEAST_ONE_CHECK"):
            got, want = ours[name].get(field), rec.get(field)
            assert (got is None) == (want is None), (name, field)
            if want is not None:
                got, want = [g if isinstance(g, list) else [g] for g in (got, want)]
                mode = "exec" if field == "POST" else "eval"
                assert [ast.dump(ast.parse(g.strip(), mode=mode)) for g in got] == \
                       [ast.dump(ast.parse(w.strip(), mode=mode)) for w in want], (name, field)


def test_precheck_and_compliance_check_pass_an_open_tiny_run(tmp_path, capsys):
    for division in ("closed", "open"):
        cfg, log = _log(tmp_path, division)
        assert precheck_config(cfg).errors == [], division
        assert main(["compliance", "check", str(log)]) in (0, 1)   # synthetic: no convergence
        out = capsys.readouterr()
        assert f"tiny_llama31{'_open' if division == 'open' else ''}.yaml" in out.out + out.err
        assert "submission_division" not in out.out + out.err


def test_check_log_uses_the_config_s_division(tmp_path, capsys):
    _, log = _log(tmp_path, "open")
    assert main(["launch", "check-log", "--config", TINY, "--set", "run.division='open'",
                 str(log)]) == 0, capsys.readouterr()
    assert capsys.readouterr().out.startswith(f"PASS {log}: compliant")
    # the closed config's check of the open run's log names the key, the line and the config
    assert main(["launch", "check-log", "--config", TINY, str(log)]) == 1
    out = capsys.readouterr().out
    line = next(i for i, ln in enumerate(log.read_text().splitlines(), start=1)
                if '"submission_division"' in ln)
    assert (f"-- {log}:{line}: submission_division 'open', but the config says run.division = "
            "'closed': the log of another config's run") in out
