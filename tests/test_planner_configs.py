"""configs/config_<SYSTEM>_*.toml (GB200, DGX B200, H200, H100) are exactly what `plan
--write-configs` writes, and valid."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llama31_405b.config.load import load_config
from llama31_405b.planner import predict, writer

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    return writer.expected_files()


def test_committed_configs_are_what_the_planner_writes(expected):
    committed = {p.name: p.read_text() for t in writer.TARGETS
                 for p in CONFIGS.glob(f"config_{t.prefix}_*.toml")}
    stale = sorted(set(committed) - set(expected))
    missing = sorted(set(expected) - set(committed))
    assert not stale and not missing, (f"stale {stale}, missing {missing}: run "
                                       "`python -m llama31_405b plan --write-configs --configs-dir configs` "
                                       "(after moving the earlier configs away)")
    for name, text in expected.items():
        assert committed[name] == text, f"{name} differs: move it away, run `python -m llama31_405b plan --write-configs --configs-dir configs`"


@pytest.mark.parametrize("target", writer.TARGETS, ids=lambda t: t.prefix)
def test_written_configs_pass_the_validator_and_follow_the_switch_rule(expected, target):
    """Each config is the published layout (and published MiniBS where there is one) unless the
    planner's best is predicted faster by more than SWITCH_MARGIN, or the published layout does
    not fit (H100); on 8-GPU systems the planner's choice keeps the published TP. The header says
    which rule chose it, and the file's prediction is the planner's for the loaded file."""
    racks = set()
    for sp in writer.plans(target=target):
        name = sp.filename
        cfg = load_config(CONFIGS / name)
        p = cfg.parallel
        c = sp.chosen
        assert (p.tp, p.pp, p.vp, p.cp, cfg.batch.minibs) == (c.tp, c.pp, c.vp, c.cp, c.minibs)
        assert cfg.system.id == target.system
        assert sp.gain <= writer.SWITCH_MARGIN or sp.switched
        if not sp.switched:
            assert (p.tp, p.pp, p.vp, p.cp) == tuple(writer.MEASURED.values())
            if sp.pinned:
                assert cfg.batch.minibs == target.published(cfg.system.racks)
        if target.spec.node_nvlink_domain:
            assert p.tp == writer.MEASURED["tp"]
        header = " ".join(line.lstrip("#").strip()
                          for line in expected[name].split("base =")[0].splitlines())
        assert ("planner's best layout and MiniBS" in header) == sp.switched
        assert f"{sp.best.layout}" in header
        assert f"step {predict(cfg).step_time_s:.2f} s" in header  # the base mirrors make_config
        d = cfg.derived
        assert name == (f"config_{target.prefix}_{d.nodes}x{d.system.gpus_per_node}x"
                        f"{cfg.batch.minibs}xtp{p.tp}pp{p.pp}cp{p.cp}.toml")
        racks.add(cfg.system.racks)
    assert racks == set(target.scales)


def test_a_large_enough_predicted_gain_switches_the_layout(monkeypatch, tmp_path):
    """With no margin the planner's best wins at 128 racks: the file sets [parallel], says why,
    and loads."""
    monkeypatch.setattr(writer, "SWITCH_MARGIN", 0.0)
    sp = writer.plan_scale(128)
    assert sp.switched and sp.chosen is sp.best and sp.gain > 0
    text = writer.render(sp)
    assert "[parallel]" in text and f"vp = {sp.best.vp}" in text and "planner's best layout" in text
    (tmp_path / "base").mkdir()
    shutil.copy(CONFIGS / "base" / "gb200_405b.toml", tmp_path / "base")
    (tmp_path / sp.filename).write_text(text)
    cfg = load_config(tmp_path / sp.filename)
    assert (cfg.parallel.vp, cfg.batch.minibs) == (sp.best.vp, sp.best.minibs)


def test_write_configs_keeps_every_file_and_inherits_the_repository_base(tmp_path):
    """In a named folder without base/ the files are created next to what it holds (a file
    matching config_GB200_*.toml that the planner does not write is kept, not deleted as stale)
    and load, inheriting the repository's base by a relative path; apart from that line they are
    the committed ones. A name already there is refused before any file is written."""
    from llama31_405b.outputs import OutputExists
    mine = tmp_path / "config_GB200_1536x4x8xtp4pp8cp2.toml"
    mine.write_text("# the user's own\n")
    keep = tmp_path / "tiny_cpu.toml"
    keep.write_text("# not a GB200 config\n")
    folder, written = writer.write_configs(tmp_path, (writer.with_scales(writer.GB200, (8, 96)),))
    assert folder == tmp_path and mine.read_text() == "# the user's own\n" and keep.exists()
    assert {p.name for p in written} == {p.name for p in tmp_path.glob("config_GB200_*.toml")} - {mine.name}
    for p in written:
        base = p.read_text().split('base = "')[1].split('"')[0]
        assert (tmp_path / base).resolve() == (CONFIGS / "base" / "gb200_405b.toml").resolve()
        assert p.read_text().replace(base, "base/gb200_405b.toml") == (CONFIGS / p.name).read_text()
        load_config(p)
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(OutputExists, match=f"config.s. to write: {written[0]} already exists"):
        writer.write_configs(tmp_path, (writer.with_scales(writer.GB200, (8, 16)),))
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before   # 16 racks' not written
