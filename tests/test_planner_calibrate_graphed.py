"""A profile of a run with full-iteration CUDA graphs (the GB200 default) calibrates the planner
to its replayed step, not to the eager steps its trace holds (issue 46, point 4): the step is the
replayed one, the time replay saves comes off the host gaps first, then off exposed
communication (planner/calibrate/graphed.py), and the memory fit reads the allocator's peaks
taken after the replayed steps, before the eager ones allocate outside the graph's pool
(profile/capture.py). The graphed profiles here are synthetic: the planner's own prediction as
the replayed step, eager steps longer by known host gaps (docs/profile.md, "CUDA graphs")."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from llama31_405b.cli import main
from llama31_405b.config.load import load_config
from llama31_405b.planner import calibrate, predict
from llama31_405b.planner.calibrate.graphed import as_replayed
from llama31_405b.planner.calibrate.read_profile import REPLAYED
from llama31_405b.planner.calibrate.synthetic import Eager, synthetic_profile
from llama31_405b.profile import capture

REPO = Path(__file__).resolve().parents[1]
GB200 = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"
KNOWN = dict(attention_bf16_fraction=0.09, elementwise_passes=31.0, host_s_per_layer_pass=0.004,
             gemm_fraction=(("fp32", 0.3),),
             gemm_part_scale=(("logits", 1.4), ("proj", 0.8), ("qkv", 1.2)),
             comm_scale=(("PP", 2.0),), collective_latency_s=0.005, nvlink_bus_efficiency=0.2)
"""A CPU's constants (as tests/test_planner_calibrate.py)."""


def tiny(tmp: Path) -> Path:
    path = tmp / "tp2pp2dp2.toml"
    path.write_text(f'base = "{REPO / "configs" / "tiny_cpu.toml"}"\n\n[parallel]\ntp = 2\npp = 2\n'
                    'vp = 1\n\n[batch]\nminibs = 4\n\n[system]\ngpus_per_rack = 8\nracks = 1\n')
    return path


def test_a_graphed_profile_calibrates_to_the_replayed_step(tmp_path, capsys):
    """Eager steps 40 % longer than the replayed one by host gaps (the launches a replay does not
    make): `plan --calibrate` fits the replayed step, and the constants come back as they were."""
    cfg_path = tiny(tmp_path)
    cfg = load_config(cfg_path)
    truth = replace(calibrate.fitted(), **KNOWN)
    replayed = predict(cfg, truth).step_time_s
    folder = synthetic_profile(tmp_path / "graphed", cfg, truth, eager=Eager(host_s=0.4 * replayed))
    assert json.loads((folder / "analysis.json").read_text())["measured_step_s"] == pytest.approx(
        1.4 * replayed)
    out = tmp_path / "cal.toml"
    rc = main(["plan", "--calibrate", str(folder), "--calibration-out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    cal = calibrate.read(out)
    assert predict(cfg, cal.fit).step_time_s == pytest.approx(replayed, rel=1e-6)
    assert cal.summary.step_s == pytest.approx(replayed, rel=1e-9)
    assert cal.summary.eager_step_s == pytest.approx(1.4 * replayed, rel=1e-9)
    assert "replayed: full-iteration CUDA graphs" in text
    for name in ("attention_bf16_fraction", "elementwise_passes", "host_s_per_layer_pass",
                 "collective_latency_s", "nvlink_bus_efficiency"):
        assert getattr(cal.fit, name) == pytest.approx(getattr(truth, name), rel=1e-6), name


def test_replay_saves_host_gaps_first_then_exposed_communication_never_kernels_first():
    """The rule of graphed.as_replayed on figures by hand (seconds per step)."""
    s = replace(calibrate.CALIBRATION, step_s=1.11, compute_s=1.0, host_s=0.03,
                parts=(("elementwise", 0.4), ("ffn_up", 0.6)),
                exposed=(("DP", 0.06), ("TP", 0.02)), dp_total_s=0.2)
    r = as_replayed(s, 1.06 / 1.11)            # 50 ms saved: 30 of host gaps, 20 of the 80 exposed
    assert (r.step_s, r.eager_step_s, r.host_s) == pytest.approx((1.06, 1.11, 0.0))
    assert dict(r.exposed) == pytest.approx({"DP": 0.045, "TP": 0.015})
    assert r.dp_total_s == pytest.approx(0.185) and r.parts == s.parts and r.compute_s == 1.0
    assert r.host_s + sum(dict(r.exposed).values()) + r.compute_s == pytest.approx(r.step_s)
    r = as_replayed(s, 0.98 / 1.11)            # more saved than gaps and waits: kernels give 20 ms
    assert r.host_s == 0.0 and dict(r.exposed) == {"DP": 0.0, "TP": 0.0}
    assert r.compute_s == pytest.approx(0.98) and dict(r.parts)["ffn_up"] == pytest.approx(0.588)
    r = as_replayed(s, 1.12 / 1.11)            # a slower replay: the difference is host time
    assert (r.host_s, r.exposed, r.compute_s) == (pytest.approx(0.04), s.exposed, 1.0)


def test_graphed_memory_is_read_after_the_replayed_steps(tmp_path):
    """The memory fit of a graphed profile takes the peaks read after its replayed steps; a
    record whose peaks were read after the eager steps too (an older `profile`: the graph's pool
    held while the eager steps allocated) gives no memory figure rather than a high one."""
    cfg = load_config(GB200)
    truth = replace(calibrate.fitted(), activation_scale=1.3, activation_fragmentation=0.35,
                    host_s_per_layer_pass=1e-4)
    folder = synthetic_profile(tmp_path / "graphed", cfg, truth, with_memory=True,
                               eager=Eager(host_s=0.05, activations_gb=40.0))
    summary = calibrate.from_profile(folder, cfg)
    fit = calibrate.solve(summary, cfg)
    assert fit.activation_scale == pytest.approx(1.3, rel=1e-9)
    assert fit.activation_fragmentation == pytest.approx(0.35, rel=1e-9)
    rec_path = folder / "ranks" / "rank00000.json"
    rec = json.loads(rec_path.read_text())
    assert rec["memory_at"] == REPLAYED
    old = {k: v for k, v in rec.items() if k not in ("memory_at", "memory_eager")}
    rec_path.write_text(json.dumps(dict(old, memory=rec["memory_eager"])))
    older = calibrate.from_profile(folder, cfg)
    assert (older.memory_allocated_gb, older.memory_reserved_gb) == (None, None)


def test_a_graphed_profile_without_replayed_steps_timed_is_refused(tmp_path, capsys):
    cfg_path = tiny(tmp_path)
    cfg = load_config(cfg_path)
    folder = synthetic_profile(tmp_path / "graphed", cfg, replace(calibrate.fitted(), **KNOWN),
                               eager=Eager(host_s=0.01))
    rec_path = folder / "ranks" / "rank00000.json"
    rec_path.write_text(json.dumps(dict(json.loads(rec_path.read_text()), baseline_step_s=[])))
    rc = main(["plan", "--calibrate", str(folder), "--calibration-out", str(tmp_path / "x.toml")])
    assert rc == 2 and "--baseline N" in capsys.readouterr().err
    assert not (tmp_path / "x.toml").exists()


def test_profile_reads_a_graphed_runs_peaks_before_the_eager_steps(tmp_path, monkeypatch):
    """profile's phases with full-iteration graphs (1 skipped, 2 replayed, 2 eager timed, 2
    profiled): the allocator's peaks are read after the last replayed step, then reset; those
    of the eager steps are recorded apart. The CUDA allocator does not run on CPU: `_memory` and
    `_reset_peaks` stand in for it, recording the step and the mode they were called in."""
    now = {"step": 0}
    resets = []
    monkeypatch.setattr(capture, "_memory", lambda run: {"step": now["step"], "eager": run.eager})
    monkeypatch.setattr(capture, "_reset_peaks", lambda run: resets.append(now["step"]))
    plan = capture.Plan(out=tmp_path, skip=1, baseline=2, steps=2, ranks=[])
    hook = capture.ProfileHook(plan, rank=0, graphs=True)
    hook.profiled, hook.parallel_groups = False, {}   # what on_run_start sets (needs megatron)
    info = SimpleNamespace(tp_rank=0, pp_rank=0, cp_rank=0, dp_rank=0)
    run = SimpleNamespace(eager=False, info=info, device=SimpleNamespace(gpu=False))
    for k in range(1, 8):
        now["step"] = k
        hook.on_step_end(run, SimpleNamespace(step=k, loss=1.0))
    rec = json.loads((tmp_path / "ranks" / "rank00000.json").read_text())
    assert rec["memory"] == {"step": 3, "eager": False} and resets == [3]
    assert rec["memory_eager"] == {"step": 7, "eager": True} and rec["memory_at"] == REPLAYED
    assert (len(rec["baseline_step_s"]), len(rec["eager_step_s"])) == (2, 2)
