"""Config messages that help: suggestions drawn from the keys and their one-line descriptions,
internal fields hidden, and a conventional file name (config_<SYSTEM>_<nodes>x<gpus>x<minibs>x
<layout>) checked against the content by `config check`, `compliance precheck` and `launch`,
with a warning when only --set overrides contradict it."""
from pathlib import Path

import pytest

from llama31_405b.cli import main
from llama31_405b.config import ConfigError, load_config
from llama31_405b.config.naming import mismatches, parse_name

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
    want = "the name says nodes 960, the content 1024 (system.id, system.racks, "
    assert main(["config", "check", str(p)]) == 1
    err = capsys.readouterr().err
    assert want in err and "rename the file to config_GB200_1024x4x16xtp4pp8cp2.toml" in err
    assert main(["compliance", "precheck", str(p)]) == 1
    assert want in capsys.readouterr().err
    assert main(["launch", "env", str(p)]) == 2
    assert want in capsys.readouterr().err


def test_layout_and_minibs_in_the_name_are_checked(tmp_path):
    p = tmp_path / "config_GB200_1024x4x32xtp4pp4cp2.toml"
    p.write_text(f'base = "{REAL}"\n')
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "the name says MiniBS 32, the content 16 (batch.minibs)" in str(e.value)
    assert "the name says PP 4, the content 8 (parallel.pp)" in str(e.value)


def test_set_overrides_that_contradict_the_name_warn(capsys):
    assert main(["launch", "env", str(REAL), "--set", "batch.minibs=8"]) == 0
    err = capsys.readouterr().err
    assert ("warning: " in err and "with the --set overrides, the name says MiniBS 16, the "
            "content 8 (batch.minibs)") in err
