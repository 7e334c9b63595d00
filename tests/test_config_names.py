"""Config messages that help: suggestions drawn from the keys and their one-line descriptions,
internal fields hidden, and a conventional file name (config_<SYSTEM>_<nodes>x<gpus>x<minibs>x
<layout>) checked against the content by `config check`, `compliance precheck` and `launch`,
with a warning when only --set overrides contradict it."""
from pathlib import Path

import pytest

from llama31_405b.cli import main
from llama31_405b.config import ConfigError, load_config
from llama31_405b.config.naming import expected_name, mismatches, parse_name

REPO = Path(__file__).resolve().parents[1]
REAL = REPO / "configs" / "config_GB200_1024x4x16xtp4pp8cp2.toml"
TINY = REPO / "configs" / "tiny_cpu.toml"


def _tiny_with(tmp_path, body: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(f'base = "{TINY}"\n{body}')
    return p


@pytest.mark.parametrize("body,want", [
    ("[parallel]\ntensor_paralel = 4\n", "did you mean 'tp': Tensor-parallel size?"),
    ("[parallel]\npipline = 2\n", "did you mean 'pp': Pipeline-parallel size?"),
    ("[parallel]\ncontext_parallel = 2\n", "did you mean 'cp': Context-parallel size"),
    ("[batch]\nmini_bs = 4\n", "did you mean 'minibs'?"),
])
def test_suggestions_from_keys_and_descriptions(tmp_path, body, want):
    with pytest.raises(ConfigError) as e:
        load_config(_tiny_with(tmp_path, body))
    assert want in str(e.value)


def test_internal_fields_are_neither_listed_nor_accepted(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(_tiny_with(tmp_path, 'source = "x.toml"\n'))
    msg = str(e.value)
    assert "unknown key 'source'" in msg and "valid keys here: model, parallel," in msg
    assert "source" not in msg.split("valid keys here:")[1]


def test_every_shipped_config_name_agrees_with_its_content():
    named = [p for p in sorted((REPO / "configs").glob("*.toml")) if parse_name(p)]
    assert len(named) == len(list((REPO / "configs").glob("config_*.toml"))) >= 18
    for p in named:
        assert mismatches(load_config(p, validate=False), p) == [], p.name


def _misnamed(tmp_path) -> Path:
    p = tmp_path / "config_GB200_960x4x16xtp4pp8cp2.toml"
    p.write_text(f'base = "{REAL}"\n')
    return p


def test_a_name_that_contradicts_the_content_is_refused_everywhere(tmp_path, capsys):
    p = _misnamed(tmp_path)
    want = ("nodes: name says 960, config gives 1024 (from system.id, system.racks, "
            "system.gpus_per_rack)")
    assert main(["config", "check", str(p)]) == 2
    err = capsys.readouterr().err
    assert want in err and "rename the file to config_GB200_1024x4x16xtp4pp8cp2.toml" in err
    assert err.startswith(f"error: {p}: the file name does not say what the file runs")
    assert main(["compliance", "precheck", str(p)]) != 0
    assert want in capsys.readouterr().err
    assert main(["launch", "env", str(p)]) == 2
    assert want in capsys.readouterr().err


def test_layout_and_minibs_in_the_name_are_checked(tmp_path):
    p = tmp_path / "config_GB200_1024x4x32xtp4pp4cp2.toml"
    p.write_text(f'base = "{REAL}"\n')
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "MiniBS: name says 32, config gives 16 (batch.minibs)" in str(e.value)
    assert "PP: name says 4, config gives 8 (parallel.pp)" in str(e.value)


def test_the_content_is_validated_before_the_name(tmp_path):
    """TP4 PP6 CP2 on a 64-GPU rack: the layout's error comes first, not a rename to the nodes
    (1020) of a layout that cannot run; the name is compared once the content is valid, and a
    new name is proposed only for a valid config."""
    p = tmp_path / "config_GB200_1024x4x18xtp4pp6cp2.toml"
    p.write_text(f'base = "{REAL}"\n[parallel]\npp = 6\n[batch]\nminibs = 18\n')
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "TP*PP*CP = 4*6*2 = 48 does not divide the 64 GPUs used per rack" in msg
    assert "1020" not in msg and "rename" not in msg
    cfg = load_config(p, validate=False)  # invalid content, returned unchecked: no name check
    assert cfg.parallel.pp == 6 and expected_name(cfg, p) is None
    q = tmp_path / "config_GB200_1024x4x18xtp4pp8cp2.toml"  # valid content, name off in MiniBS
    q.write_text(f'base = "{REAL}"\n')
    with pytest.raises(ConfigError) as e:
        load_config(q)
    assert "MiniBS: name says 18, config gives 16 (batch.minibs)" in str(e.value)
    assert "rename the file to config_GB200_1024x4x16xtp4pp8cp2.toml" in str(e.value)
    assert "nodes:" not in str(e.value)


def test_set_overrides_that_contradict_the_name_warn(capsys):
    assert main(["launch", "env", str(REAL), "--set", "batch.minibs=8"]) == 0
    err = capsys.readouterr().err
    assert "warning: " in err and "with the --set overrides, the runs will not be" in err
    assert "MiniBS: name says 16, config gives 8 (batch.minibs)" in err
