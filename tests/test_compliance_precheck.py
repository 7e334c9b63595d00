"""`compliance precheck`: the real checker on a config's header events before launch."""
import math
from pathlib import Path

import pytest

from llama31_405b.cli import main
from llama31_405b.config import load_config
from llama31_405b.mlperf import Event, header_events
from llama31_405b.submission.precheck import check_events, precheck_config

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").glob("*.toml"))
GB200_1024 = REPO / "configs" / "config_GB200_1024x4x16xtp4pp8cp2.toml"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_passes(path):
    res = precheck_config(load_config(path))
    assert res.ok, res.errors
    rules = res.check.rule_files
    if "tiny" in path.name:
        assert [Path(r).name for r in rules] == ["tiny_llama31.yaml"]
    else:
        assert rules[-1] == "training_6.0.0/closed_llama31_405b.yaml"


def _replace(events, key, value):
    assert any(e.key == key for e in events)
    return [Event(e.key, value, e.metadata) if e.key == key else e for e in events]


def test_unceiled_warmup_fails_on_decay_steps_at_gbs_1008():
    cfg = load_config(GB200_1024, overrides={"system": {"racks": 63}})
    gbs = cfg.derived.gbs
    assert gbs == 1008
    good = header_events(cfg, seed=7)
    assert check_events(good, cfg).ok
    floor_warmup = math.floor(8000 * 1152 / gbs)          # the mistake of mlcommons/training#841
    bad = _replace(good, "opt_learning_rate_decay_steps",
                   math.ceil(1_200_000 * 1152 / gbs) - floor_warmup)
    res = check_events(bad, cfg)
    assert not res.ok
    text = "\n".join(res.summary(locate=False))
    assert "opt_learning_rate_decay_steps" in text
    assert "opt_base_learning_rate" not in text


def test_lr_rounded_to_8_decimals_fails_at_gbs_1024():
    cfg = load_config(GB200_1024)
    assert cfg.derived.gbs == 1024
    good = header_events(cfg, seed=1)
    lr = next(e.value for e in good if e.key == "opt_base_learning_rate")
    res = check_events(_replace(good, "opt_base_learning_rate", round(lr, 8)), cfg)
    assert not res.ok
    assert any("opt_base_learning_rate" in s and "7.111e-05" in s for s in res.summary(locate=False))


def test_cli_exit_codes_and_messages(tmp_path, capsys):
    assert main(["compliance", "precheck", str(REPO / "configs" / "tiny_cpu.toml")]) == 0
    bad = tmp_path / "two_runs.toml"
    bad.write_text(f'base = "{GB200_1024}"\n[run]\nnum_runs = 2\n')
    assert main(["compliance", "precheck", str(GB200_1024), str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"FAIL {bad}" in err and "exactly 3 result files" in err


def test_too_few_runs_and_tiny_header_with_a_wrong_value():
    cfg = load_config(REPO / "configs" / "tiny_cpu.toml", overrides={"run": {"num_runs": 2}})
    res = precheck_config(cfg)
    assert any("exactly 3" in e for e in res.errors)
    cfg = load_config(REPO / "configs" / "tiny_cpu.toml")
    bad = _replace(header_events(cfg, seed=1), "max_sequence_length", 512)
    res = check_events(bad, cfg)
    assert not res.ok and "max_sequence_length" in res.summary(locate=False)[0]
