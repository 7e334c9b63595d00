"""configs/config_GB200_*.toml are exactly what `plan --write-configs` writes, and valid."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llama31_405b.config.load import load_config
from llama31_405b.planner import writer

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    return writer.expected_files()


def test_committed_gb200_configs_are_what_the_planner_writes(expected):
    committed = {p.name: p.read_text() for p in CONFIGS.glob("config_GB200_*.toml")}
    stale = sorted(set(committed) - set(expected))
    missing = sorted(set(expected) - set(committed))
    assert not stale and not missing, (f"stale {stale}, missing {missing}: run "
                                       "`python -m llama31_405b plan --write-configs`")
    for name, text in expected.items():
        assert committed[name] == text, f"{name} differs: run `python -m llama31_405b plan --write-configs`"


def test_written_configs_pass_the_validator_and_keep_the_fixed_choices(expected):
    racks = set()
    for name in expected:
        cfg = load_config(CONFIGS / name)
        p = cfg.parallel
        assert (p.tp, p.pp, p.vp, p.cp) == (4, 8, 8, 2)
        racks.add(cfg.system.racks)
        if cfg.system.racks in writer.PUBLISHED_MINIBS:
            assert cfg.batch.minibs == writer.PUBLISHED_MINIBS[cfg.system.racks]
        d = cfg.derived
        assert name == f"config_GB200_{d.nodes}x4x{cfg.batch.minibs}xtp4pp8cp2.toml"
    assert racks == set(writer.RACKS)


def test_write_configs_replaces_stale_files(tmp_path):
    (tmp_path / "base").mkdir()
    shutil.copy(CONFIGS / "base" / "gb200_405b.toml", tmp_path / "base")
    stale = tmp_path / "config_GB200_1536x4x8xtp4pp8cp2.toml"
    stale.write_text("# old\n")
    keep = tmp_path / "tiny_cpu.toml"
    keep.write_text("# not a GB200 config\n")
    written, deleted = writer.write_configs(tmp_path, racks=(8, 96))
    assert [p.name for p in deleted] == [stale.name] and not stale.exists() and keep.exists()
    assert {p.name for p in written} == {p.name for p in tmp_path.glob("config_GB200_*.toml")}
    with pytest.raises(FileNotFoundError, match="base"):
        writer.write_configs(tmp_path / "nowhere")
