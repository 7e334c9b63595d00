"""Issue 45, the rest of items 4-6: `plan --write-configs` writes into a new folder and deletes
nothing, `compliance tiny-rcp` never replaces an RCP file and refuses mixed platforms, and two
demos started in one second get different log folders. Each test fails without its fix (the
earlier code rewrote configs/ and deleted "stale" configs, overwrote the RCP file, built RCPs
from mixed platforms, and only named the demo's folder, minutes before its first write)."""
from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import REPO
from llama31_405b.cli import main
from mlperf_logs import copy_logs, need_fixture, set_value


# -- plan --write-configs ----------------------------------------------------------------------
def test_write_configs_makes_a_new_folder_and_keeps_a_users_configs(tmp_path, monkeypatch,
                                                                    capsys):
    """Default: a new out/configs (then out/configs-2), printed, each file loading from there; a
    named folder keeps the user's own config_GB200_*.toml and refuses an earlier generated one
    (exit 2, naming it), writing nothing. (Two GB200 scales instead of every target's: time.)"""
    from llama31_405b.config.load import load_config
    from llama31_405b.planner import writer
    monkeypatch.setattr(writer, "TARGETS", (writer.with_scales(writer.GB200, (8, 128)),))
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--write-configs"]) == 0
    out = capsys.readouterr().out
    names = ["config_GB200_128x4x144xtp4pp8cp2.toml", "config_GB200_2048x4x8xtp4pp8cp2.toml"]
    assert out == "configs folder: out/configs\n" + "".join(
        f"wrote   out/configs/{n}\n" for n in names)
    first = {p.name: p.read_bytes() for p in (tmp_path / "out" / "configs").iterdir()}
    assert main(["plan", "--write-configs"]) == 0
    assert capsys.readouterr().out.startswith("configs folder: out/configs-2\n")
    assert {p.name: p.read_bytes() for p in (tmp_path / "out" / "configs").iterdir()} == first
    assert load_config(tmp_path / "out" / "configs-2" / names[1]).batch.minibs == 8
    mine = tmp_path / "out" / "configs-2" / "config_GB200_mine.toml"
    mine.write_text("# the user's own\n")
    (tmp_path / "out" / "configs-2" / names[0]).unlink()   # one generated file left out...
    assert main(["plan", "--write-configs", "--configs-dir", "out/configs-2"]) == 2
    assert capsys.readouterr().err == (
        f"error: --configs-dir: 1 config(s) to write: out/configs-2/{names[1]} already exists, "
        "kept (a result is never replaced); move the earlier configs away, or leave "
        "--configs-dir unset for a new folder\n")
    assert mine.read_text() == "# the user's own\n"                     # ...is not written
    assert not (tmp_path / "out" / "configs-2" / names[0]).exists()


# -- compliance tiny-rcp ---------------------------------------------------------------------
def _tiny_logs(tmp_path: Path) -> list[Path]:
    """The published logs relabelled tiny_llama31 (tiny-rcp takes only tiny logs)."""
    need_fixture()
    logs = copy_logs(tmp_path)
    for p in logs:
        set_value(p, "submission_benchmark", "tiny_llama31")
    return logs


def test_tiny_rcp_never_replaces_an_rcp_file(tmp_path, monkeypatch, capsys):
    """Without --out a new file next to the project's (printed); an existing --out is refused
    (exit 2, naming it) before the logs are read, the file kept byte for byte."""
    from llama31_405b.submission import rcp
    logs = list(map(str, _tiny_logs(tmp_path)))
    default = tmp_path / "compliance" / "tiny_llama31_rcps.json"
    default.parent.mkdir()
    default.write_text('{"earlier": 1}\n')
    monkeypatch.setattr(rcp, "TINY_RCP_FILE", default)   # the repository's own stays untouched
    assert main(["compliance", "tiny-rcp", *logs]) == 0
    new = default.with_name("tiny_llama31_rcps-2.json")
    assert f"wrote {new}\n" in capsys.readouterr().out
    assert default.read_text() == '{"earlier": 1}\n'
    assert json.loads(new.read_text())["tiny_llama31_ref_576"]["BS"] == 576
    assert main(["compliance", "tiny-rcp", *logs, "--out", str(default)]) == 2
    assert capsys.readouterr().err == (
        f"error: {default} already exists, kept (a result is never replaced); give another "
        "--out, or move the earlier file away\n")
    assert default.read_text() == '{"earlier": 1}\n'


def test_tiny_rcp_refuses_mixed_platforms(tmp_path, capsys):
    logs = _tiny_logs(tmp_path)
    set_value(logs[1], "submission_platform", "other")
    out = tmp_path / "r.json"
    assert main(["compliance", "tiny-rcp", *map(str, logs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the logs mix platforms: ") and f"'other': {logs[1]}" in err
    assert err.rstrip().endswith("; build an RCP from the logs of one organisation, platform "
                                 "and division together")
    assert not out.exists()


# -- demo --------------------------------------------------------------------------------------
def test_demo_claims_a_new_log_folder_first(tmp_path, monkeypatch, capsys):
    """Another demo's folder of this second (and the next few) is left alone: this demo makes
    demo-<stamp>-2 before any other work (here the data step then fails on a data_dir that is a
    file) and nothing is written into the other's."""
    data = tmp_path / "tiny"
    data.write_text("not a folder\n")
    cfg = tmp_path / "mine.toml"
    cfg.write_text(f'base = "{REPO / "configs" / "tiny_cpu.toml"}"\n[data]\n'
                   f'data_dir = "{data}"\n')
    now = time.time()
    others = [tmp_path / "logs" / f"demo-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now + s))}"
              for s in range(30)]
    for d in others:
        d.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--config", str(cfg)]) != 0
    line = capsys.readouterr().out.splitlines()[0]
    made = Path(line.removeprefix("[demo] log folder ").removesuffix(" (new)"))
    assert made.name.endswith("-2") and made.parent == tmp_path / "logs" and made.is_dir()
    assert made.with_name(made.name[:-2]) in others
    assert all(not any(d.iterdir()) for d in others)
