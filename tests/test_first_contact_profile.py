"""first-contact's `profile` check (llama31_405b/first_contact/profiling.py): the slice's
run profiled by the project's `profile` machinery after every other check, its folders packed
into one file beside the report, which unpacks to folders that profile/report.analyze_folder
analyses again; a failure is the check's, with its reason, and leaves the profiler off.

The slice runs in this process on configs/tiny_cpu.toml. With full-iteration graphs stood in
for by the replay double (tests/helpers/graph_double.py), the check takes the GPU's branch: a
replayed and an eager step timed, eager steps profiled (Megatron's schedule called directly),
then replayed steps profiled into a second folder. The plain CPU branch (no graphs) runs in
tests/test_first_contact.py's end-to-end test, whose slice checks include `profile`."""
from __future__ import annotations

import json
import os
import tarfile

import pytest

from conftest import REPO
from llama31_405b import first_contact as fc
from llama31_405b.first_contact import checks, profiling

TINY = REPO / "configs" / "tiny_cpu.toml"
OTHER_SLICE_CHECKS = [n for n in fc.PHASES["slice"] if n != "profile"]


def _slice(monkeypatch, tmp_path, *, graphs: bool):
    """The slice phase of tiny_cpu in this process (2 steps); returns its report."""
    monkeypatch.setattr(os, "environ", dict(os.environ))     # run_checks exports launch_env
    if graphs:
        monkeypatch.syspath_prepend(str(REPO / "tests" / "helpers"))
        import graph_double
        import megatron.core.full_cuda_graph as fcg
        monkeypatch.setattr(fcg, "FullCudaGraphWrapper", graph_double.make_double())
        real = checks.slice_config
        monkeypatch.setattr(checks, "slice_config",
                            lambda *a, **k: real(*a, **{**k, "graphs": True}))
    return fc.run_checks(TINY, steps=2, phases=("slice",), cpu=True,
                         report_path=tmp_path / "slice.json", workdir=str(tmp_path / "work"))


def _unpack(pack, dest):
    with tarfile.open(pack) as tar:
        tar.extractall(dest, filter="data")
    return dest


@pytest.mark.slow
@pytest.mark.xdist_group("first_contact_profile")   # one worker: the imports paid once
def test_the_profile_of_replayed_and_eager_steps_comes_back_in_one_file(monkeypatch, tmp_path):
    rep = _slice(monkeypatch, tmp_path, graphs=True)
    by = rep.checks
    for name in OTHER_SLICE_CHECKS:
        assert by[name].status == "passed", (name, by[name].detail)
    prof = by["profile"]
    assert prof.status == "passed", prof.detail
    pack = tmp_path / "profile_slice.tgz"
    assert prof.data["pack"]["path"] == str(pack) and pack.is_file()
    assert prof.data["pack"]["folders"] == ["profile", "profile_replayed"]
    assert prof.data["pack"]["left_out"] == []
    saved = {c["name"]: c for c in json.loads((tmp_path / "slice.json").read_text())["checks"]}
    assert saved["profile"]["status"] == "passed"
    eager, replayed = prof.data["eager"], prof.data["replayed"]
    # what `profile` does with full-iteration graphs: a replayed step, an eager step, timed
    # without the profiler, then eager steps profiled; then replayed steps profiled
    assert len(eager["baseline_step_s"]) == 1 and len(eager["eager_step_s"]) == 1
    assert len(eager["steps_s"]) == len(eager["profiled_step_s"]) == 2
    assert eager["graphs_speedup"] > 0 and len(replayed["steps_s"]) == 2
    # through the graph (the double; first-contact's trace_calls logs those calls): the timed
    # replayed step and the replayed folder's 1 skipped + 2 profiled steps; the 3 eager steps
    # ran Megatron's schedule directly
    assert [c[0].split()[0] for c in prof.data["calls"]] == ["_forward_backward"] * 4
    assert eager["memory"] is None and replayed["memory"] is None       # CPU: no allocator
    assert eager["gpu_trace"] is False and eager["cpu_ops"] > 0
    # the module roles were annotated: the eager steps' GEMMs carry them
    assert eager["components"]["compute.gemm_ffn_up"] > 0
    assert eager["components"]["compute.gemm_lm_head"] > 0

    out = _unpack(pack, tmp_path / "unpacked")
    for name, fig in (("profile", eager), ("profile_replayed", replayed)):
        folder = out / name
        assert (folder / "NOT_AN_MLPERF_RUN.txt").is_file()
        rec = json.loads((folder / "ranks" / "rank00000.json").read_text())
        assert "memory" in rec and rec["memory"] is None
        analysis = json.loads((folder / "analysis.json").read_text())
        steps = [s["step_s"] for s in analysis["ranks"]["0"]["steps_detail"]]
        assert steps == fig["steps_s"] and all(s > 0 for s in steps)
        # the unpacked folder analyses again here, as a GPU's will
        from llama31_405b.profile.report import analyze_folder
        (folder / "analysis.json").unlink()
        again = analyze_folder(folder, workers=1)
        assert [s["step_s"] for s in again["ranks"][0]["steps_detail"]] == pytest.approx(steps)
    manifest = json.loads((out / "profile_replayed" / "profile.json").read_text())
    assert manifest["first_contact"].startswith("replayed steps profiled")
    # the loop's own steps came first: the profile's steps follow the `steps` check's
    assert len(by["steps"].data["losses"]) == 2


@pytest.mark.slow
@pytest.mark.xdist_group("first_contact_profile")   # one worker: the imports paid once
def test_a_profile_that_fails_is_the_profile_check_failing(monkeypatch, tmp_path):
    """A step that fails under the profiler: the check fails with the reason, the profiler is
    stopped, every other slice check stands, and what was written is still packed."""
    import torch

    from llama31_405b.profile.capture import ProfileHook
    real = ProfileHook.on_step_end

    def failing(self, run, stats):
        if self.prof is not None:
            raise RuntimeError("injected: a step failed under the profiler")
        return real(self, run, stats)
    monkeypatch.setattr(ProfileHook, "on_step_end", failing)
    rep = _slice(monkeypatch, tmp_path, graphs=False)
    prof = rep.checks["profile"]
    assert prof.status == "failed"
    assert prof.detail == "RuntimeError: injected: a step failed under the profiler"
    assert not torch.autograd.profiler._is_profiler_enabled
    for name in OTHER_SLICE_CHECKS:
        assert rep.checks[name].status == "passed", (name, rep.checks[name].detail)
    pack = tmp_path / "profile_slice.tgz"
    assert prof.data["pack"]["path"] == str(pack)
    out = _unpack(pack, tmp_path / "unpacked")
    assert (out / "profile" / "profile.json").is_file()
    assert not (out / "profile" / "traces").exists()


def test_the_pack_sits_beside_the_report_and_leaves_traces_out_past_its_limit(monkeypatch,
                                                                             tmp_path):
    assert profiling.pack_path(tmp_path / "slice.json") == tmp_path / "profile_slice.tgz"
    # a rerun's report (scripts/h200_outputs.py tags NAME.EXT as NAME.2.EXT): its pack, tagged
    assert profiling.pack_path(tmp_path / "slice.2.json") == tmp_path / "profile_slice.2.tgz"
    assert profiling.pack_path(None) is None
    folder = tmp_path / "profile"
    (folder / "traces").mkdir(parents=True)
    (folder / "analysis.json").write_text("{}")
    (folder / "traces" / "rank00000.trace.json.gz").write_bytes(os.urandom(4096))
    small = profiling._pack([folder], tmp_path / "a.tgz")
    assert small["left_out"] == []
    monkeypatch.setattr(profiling, "PACK_LIMIT", 1024)
    cut = profiling._pack([folder], tmp_path / "b.tgz")
    assert cut["left_out"] == ["profile/traces/rank00000.trace.json.gz"]
    with tarfile.open(tmp_path / "b.tgz") as tar:
        assert "profile/analysis.json" in tar.getnames()
        assert "profile/traces/rank00000.trace.json.gz" not in tar.getnames()
    assert not list(tmp_path.glob(".*.tmp"))


def test_on_a_gpu_the_check_needs_kernels_and_the_allocator_peaks():
    fig = dict(folder="profile", steps_s=[0.5, 0.5], gpu_trace=False, memory=None)
    assert profiling._problems(fig, gpu=False) == []
    gpu = profiling._problems(fig, gpu=True)
    assert len(gpu) == 2 and "no CUDA kernel" in gpu[0] and "max_memory_allocated" in gpu[1]
    # a replay's trace may hold no kernel (what it holds is the finding), the peaks it must
    assert len(profiling._problems(fig, gpu=True, kernels_needed=False)) == 1
    ok = dict(fig, gpu_trace=True, memory={"max_allocated_gb": 1.0})
    assert profiling._problems(ok, gpu=True) == []
    assert "no profiled step" in profiling._problems(dict(ok, steps_s=[]), gpu=True)[0]
