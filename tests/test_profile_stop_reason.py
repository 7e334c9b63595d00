"""`profile` whose run ends before its profiled steps: the error names the run's own reason
(e.g. the data check's), where it had said only that the run stopped (2026-12-06: a work folder
whose copied data failed its manifest check stopped every profile with no cause printed)."""
from __future__ import annotations

from conftest import REPO

from llama31_405b.cli import main
from llama31_405b.profile import capture


def test_a_stopped_profile_names_the_runs_reason(tmp_path, monkeypatch, capsys):
    reason = "data not verified (/d/manifest.json): x.bin/.idx: size or mtime changed"

    def stopped(cfg, plan, **kwargs):
        hook = capture.ProfileHook(plan, rank=0)
        hook.on_run_stop(None, "aborted", reason)   # what Run.execute tells every hook
        return hook
    monkeypatch.setattr(capture, "run_profile", stopped)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    rc = main(["profile", str(REPO / "configs" / "tiny_cpu.toml"), "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"the run stopped before its profiled steps were written (aborted: {reason})" in err
