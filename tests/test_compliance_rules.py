"""The tiny rules file and the tiny RCP file: current, derived from rules.py, readable by the
real checkers."""
import ast
import json

import pytest
import yaml

from llama31_405b.config.rules import LLAMA31_405B, TINY_LLAMA31
from llama31_405b.submission import rcp, tiny_rules


def _norm(expr: str) -> str:
    return ast.dump(ast.parse(expr.strip(), mode="eval"))


def test_committed_tiny_rules_file_is_current():
    assert tiny_rules.TINY_RULES_FILE.read_text() == tiny_rules.render_tiny_rules(), (
        "compliance/tiny_llama31.yaml is stale: run "
        "`python -m llama31_405b compliance tiny-rules --write`")


def test_benchmark_formulas_reproduce_the_packages_llama31_405b_rules():
    ours = {r["NAME"]: r for r in tiny_rules.benchmark_records(LLAMA31_405B)}
    stock = {}
    for item in tiny_rules.package_rules("closed_llama31_405b.yaml"):
        stock[item["KEY"]["NAME"]] = item["KEY"]
    assert set(ours) == set(stock)
    for name, rec in stock.items():
        for field in ("CHECK", "POST", "ATLEAST_ONE_CHECK"):
            got, want = ours[name].get(field), rec.get(field)
            assert (got is None) == (want is None), (name, field)
            if want is None:
                continue
            got = got if isinstance(got, list) else [got]
            want = want if isinstance(want, list) else [want]
            mode = "exec" if field == "POST" else "eval"
            assert [ast.dump(ast.parse(g.strip(), mode=mode)) for g in got] == \
                   [ast.dump(ast.parse(w.strip(), mode=mode)) for w in want], (name, field)
        assert ours[name]["REQ"] == rec["REQ"]


def test_tiny_rules_take_every_constant_from_rules_py():
    recs = {r["NAME"]: r for r in yaml.load(tiny_rules.TINY_RULES_FILE.read_text(),
                                            Loader=yaml.BaseLoader) if "KEY" in r
            for r in [r["KEY"]]}
    t = TINY_LLAMA31
    assert f"== {t.name!r}" in recs["submission_benchmark"]["CHECK"][0]
    assert recs["max_sequence_length"]["CHECK"] == [f"v['value'] == {t.seq_length}"]
    assert recs["eval_samples"]["CHECK"][-1] == f"v['value'] == {t.eval_samples}"
    assert _norm(recs["opt_base_learning_rate"]["CHECK"][0]) == _norm(
        f"v['value'] * {t.ref_gbs} == s['global_batch_size'] * {t.base_lr!r}")
    assert f"math.ceil({t.total_ref_steps} * {t.ref_gbs} /" in recs["opt_learning_rate_decay_steps"]["CHECK"][0]
    assert f"math.ceil({t.warmup_ref_steps} * {t.ref_gbs} /" in recs["opt_learning_rate_warmup_steps"]["POST"]
    assert f"<= {t.target!r}" in recs["eval_accuracy"]["ATLEAST_ONE_CHECK"]
    # no enqueue of the package's closed_<benchmark> rules anywhere
    assert "enqueue_config" not in tiny_rules.TINY_RULES_FILE.read_text().split("- BEGIN:")[1]


def test_tiny_rcp_file_is_read_by_the_rcp_checker():
    data = json.loads(rcp.TINY_RCP_FILE.read_text())
    assert all(r["Benchmark"] == TINY_LLAMA31.name for r in data.values())
    ref = rcp.reference(TINY_LLAMA31.name, TINY_LLAMA31.ref_gbs)
    assert ref.kind == "found" and ref.mean > 0 and ref.min_samples <= ref.mean
    assert rcp.reference(TINY_LLAMA31.name, 2 * TINY_LLAMA31.ref_gbs).kind == "missing"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # scipy: 3 runs leave 0 dof in the t-test
def test_rcp_records_from_runs_are_read_by_the_rcp_checker(tmp_path):
    """The generator behind `compliance tiny-rcp`, on real converged runs."""
    from mlperf_logs import LOGS, need_fixture

    from llama31_405b.mlperf.log import load_run
    need_fixture()
    recs = rcp.rcp_records([load_run(p) for p in LOGS], creator="t", when="w", platform="p",
                           precision="NVFP4")
    assert list(recs) == ["llama31_405b_ref_576"]
    assert recs["llama31_405b_ref_576"]["Epochs to converge"] == [288000, 294912, 294912]
    path = rcp.write_rcps(recs, tmp_path / "r.json")
    ref = rcp.reference("llama31_405b", 576, rcp_file=path)
    assert ref.kind == "found" and abs(ref.mean - 294912) < 1e-6


def test_tiny_rcp_cli_refuses_non_tiny_logs(capsys):
    from mlperf_logs import LOGS, need_fixture

    from llama31_405b.cli import main
    need_fixture()
    assert main(["compliance", "tiny-rcp", str(LOGS[0]), "--out", "/nonexistent/x.json"]) == 2
    assert "not tiny_llama31 logs" in capsys.readouterr().err


def test_tiny_rules_cli_prints_the_committed_file(capsys):
    from llama31_405b.cli import main
    assert main(["compliance", "tiny-rules"]) == 0
    assert capsys.readouterr().out == tiny_rules.TINY_RULES_FILE.read_text()


def test_the_stock_command_line_runs_the_tiny_chain(tmp_path):
    """`python -m mlperf_logging.compliance_checker --usage training --ruleset 6.0.0 --config
    <absolute path>` runs the tiny rules; a relative --config cannot (the checker joins it onto
    its package directory), which is why the docs and the tool use the absolute path."""
    import subprocess
    import sys

    from llama31_405b.config import load_config
    from llama31_405b.mlperf import header_events
    from llama31_405b.submission.precheck import log_lines
    cfg = load_config(tiny_rules.COMPLIANCE_DIR.parent / "configs" / "tiny_cpu.toml")
    log = tmp_path / "tiny.log"
    log.write_text("\n".join(log_lines(header_events(cfg, seed=1), cfg)) + "\n")
    base = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
            "--ruleset", "6.0.0", "--log_output", str(tmp_path / "cc.log")]
    p = subprocess.run(base + ["--config", str(tiny_rules.TINY_RULES_FILE), str(log)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0 and "SUCCESS" in p.stderr + p.stdout
    assert "tiny_llama31.yaml" in p.stderr + p.stdout
    p = subprocess.run(base + ["--config", "compliance/tiny_llama31.yaml", str(log)],
                       capture_output=True, text=True, cwd=tiny_rules.COMPLIANCE_DIR.parent)
    assert p.returncode != 0
    assert "compliance_checker/compliance/tiny_llama31.yaml" in p.stderr  # looked up in site-packages
