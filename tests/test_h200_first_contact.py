"""scripts/h200_first_contact.py, the prepared first-contact command for a bare H200 test image:
the wheel list covers what the project imports there (checked from a clean path holding only
the repository, those packages and the image's, emulated from this environment), the wheel
folder is ignored and refused when it would not travel, and the reports of the phase processes
merge into one even when a phase was killed before it wrote anything."""
import importlib.util
import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("h200_first_contact",
                                               REPO / "scripts" / "h200_first_contact.py")
h200 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(h200)
REPORT = h200.outputs.report_module()     # llama31_405b/first_contact/report.py


def _name(req: str) -> str:
    return h200.norm(re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0])


def test_every_runtime_dependency_is_carried_or_in_the_image():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    image = {h200.norm(n) for n in h200.IMAGE_PACKAGES}
    for d in map(_name, deps):
        assert d in h200.WHEELS or d in image, d
    assert not set(h200.WHEELS) & image          # carry only what the image lacks
    pins = dict(line.split("==") for line in (REPO / "constraints" / "cpu.txt").read_text().split()
                if "==" in line)
    pins = {h200.norm(k): v for k, v in pins.items()}
    assert {n: pins[n] for n in h200.WHEELS} == h200.WHEELS


def test_the_wheel_folder_is_ignored_and_checked(tmp_path):
    r = subprocess.run(["git", "check-ignore", "-q", ".whl/x.whl"], cwd=REPO)
    assert r.returncode == 0, ".whl/ must be ignored (it travels with `carry`, not with git)"
    (tmp_path / "megatron_core-0.19.2-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"x")
    with pytest.raises(SystemExit, match="lacks mlperf-logging"):
        h200.wheel_files(tmp_path)
    (tmp_path / "mlperf_logging-4.1.68-py3-none-any.whl").write_bytes(b"x")
    assert len(h200.wheel_files(tmp_path)) == 2
    (tmp_path / "mlperf_logging-4.1.67-py3-none-any.whl").write_bytes(b"x")
    with pytest.raises(SystemExit, match="more than one version of mlperf-logging"):
        h200.wheel_files(tmp_path)
    (tmp_path / "mlperf_logging-4.1.67-py3-none-any.whl").unlink()
    with open(tmp_path / "mlperf_logging-4.1.68-py3-none-any.whl", "wb") as f:
        f.truncate(65 * 2**20)
    with pytest.raises(SystemExit, match="at most 64 MiB"):
        h200.wheel_files(tmp_path)


def _report(path, statuses):
    path.write_text(json.dumps({"meta": {}, "checks": [
        {"name": n, "status": s, "detail": d, "seconds": 0, "data": {}}
        for n, (s, d) in statuses.items()]}))


def test_reports_of_the_phases_merge_a_killed_phase_included(tmp_path):
    names = ("gpu", "build", "steps", "dp2_eval_sync", "matmul_ceiling", "layer_bf16")
    nr = {n: ("not run", "phase not selected") for n in names}
    _report(tmp_path / "slice.json", {**nr, "gpu": ("passed", "H200"), "build": ("passed", "ok"),
                                      "steps": ("not run", "time budget: 3 s left")})
    _report(tmp_path / "dp2.json", {**nr, "gpu": ("passed", "H200"),
                                    "dp2_eval_sync": ("not run", "needs 2 GPUs (this machine has 1)")})
    doc, lines = h200.merge(tmp_path, ["layer", "slice", "dp2"])     # layer: killed, no file
    by = {c["name"]: c for c in doc["checks"]}
    assert by["build"]["status"] == "passed" and by["gpu"]["status"] == "passed"
    assert by["steps"]["detail"] == "time budget: 3 s left"
    assert by["dp2_eval_sync"]["detail"] == "needs 2 GPUs (this machine has 1)"
    for n in REPORT.PHASES["layer"]:                                 # every check of the phase
        assert by[n]["detail"] == "phase layer left no report"
    assert by["evaluation"]["detail"] == "phase slice's report lacks it"
    assert [c["name"] for c in doc["checks"]] == list(REPORT.CHECKS)
    n = len(REPORT.CHECKS)
    assert doc["summary"] == {"passed": 2, "failed": 0, "not run": n - 2}
    assert lines[-1] == f"0 failed, 2 passed, {n - 2} not run"


def _phase_reports(folder, passed_in):
    """A report per phase as first-contact writes it: every check; the phase `passed_in[c]`
    owning check c passed it, every other phase has it "not run: phase not selected"."""
    for phase in ("layer", "slice", "dp2"):
        _report(folder / f"{phase}.json", {
            n: ("passed", f"by {phase}") if passed_in.get(n) == phase
            else ("not run", f"phase {passed_in.get(n, '?')!r} not selected (--phases)")
            for n in REPORT.CHECKS})


def test_each_check_is_taken_from_the_phase_that_runs_it(tmp_path):
    """nvfp4_emulation (and the FP8 checks) are the layer phase's: the slice's report has them
    "not run: phase not selected", and the summary must not take that."""
    owner = {n: p for p, names in REPORT.PHASES.items() for n in names}
    _phase_reports(tmp_path, owner)
    doc, _ = h200.merge(tmp_path)
    by = {c["name"]: c for c in doc["checks"]}
    for n, p in owner.items():
        assert by[n]["status"] == "passed" and by[n]["detail"] == f"by {p}", n
    assert {"nvfp4_emulation", "matmul_ceiling_fp8", "gemms_tp4"} <= set(REPORT.PHASES["layer"])


def test_a_phase_rerun_alone_never_overwrites_and_wins_the_merge(tmp_path):
    owner = {n: p for p, names in REPORT.PHASES.items() for n in names}
    _phase_reports(tmp_path, owner)
    _report(tmp_path / "slice.json", {"steps": ("failed", "first run")})
    for f in h200.RUN_FILES:
        (tmp_path / f).write_text("first run")
    assert h200.run_tag(tmp_path) == ".2"
    _report(tmp_path / "slice.2.json", {"steps": ("passed", "rerun")})
    doc, _ = h200.merge(tmp_path)
    by = {c["name"]: c for c in doc["checks"]}
    assert by["steps"]["detail"] == "rerun" and doc["meta"]["slice"]["file"] == "slice.2.json"
    assert by["nvfp4_emulation"]["detail"] == "by layer"      # the earlier run's layer phase
    assert doc["meta"]["layer"]["file"] == "layer.json"
    (tmp_path / "slice.10.json").write_text((tmp_path / "slice.2.json").read_text())
    assert h200.outputs.latest(tmp_path, "slice.json").name == "slice.10.json"
    assert h200.run_tag(tmp_path) == ".3"                     # slice.2.json is taken


def test_merge_collects_the_runs_folders_without_overwriting(tmp_path, capsys):
    first, rerun, dest = tmp_path / "first", tmp_path / "rerun", tmp_path / "dest"
    first.mkdir(), rerun.mkdir()
    owner = {n: p for p, names in REPORT.PHASES.items() for n in names}
    _phase_reports(first, owner)
    _report(first / "slice.json", {"build": ("failed", "first run")})
    (first / "summary.txt").write_text("first")
    _report(rerun / "slice.json", {"build": ("passed", "rerun")})
    (rerun / "summary.txt").write_text("rerun")
    assert h200.main(["merge", str(dest), str(first), str(rerun)]) == 0
    names = sorted(f.name for f in dest.iterdir())
    assert names == ["dp2.json", "layer.json", "report.3.json", "slice.2.json", "slice.json",
                     "summary.2.txt", "summary.3.txt", "summary.txt"]
    assert (dest / "summary.txt").read_text() == "first"
    assert (dest / "summary.2.txt").read_text() == "rerun"
    merged = json.loads((dest / "report.3.json").read_text())
    by = {c["name"]: c for c in merged["checks"]}
    assert by["build"]["detail"] == "rerun" and by["nvfp4_emulation"]["detail"] == "by layer"
    assert "build" in (dest / "summary.3.txt").read_text()
    assert h200.main(["merge", str(dest)]) == 0             # again: new names only
    assert (dest / "report.4.json").exists() and (dest / "summary.4.txt").exists()


def test_the_run_fits_the_budget():
    """Install, env.txt and the phases' floors fit the deadline, and the deadline leaves the
    device command's 240 s (docs/gpu_settings.md) a margin: a start, the run and a rerun in 15
    minutes of machine time."""
    floors = sum(p.floor_s for p in h200.PHASES if p.gpus == 1)
    assert h200.INSTALL_TIMEOUT_S + 5 * h200.SH_TIMEOUT_S + floors <= h200.DEADLINE_S <= 225
    assert [p.name for p in h200.PHASES] == list(REPORT.PHASES)
    doc = (REPO / "docs" / "gpu_settings.md").read_text()
    assert "timeout_s 240" in doc and "timeout_s=240" in h200.__doc__


def _other_python():
    """A Python that is not 3.12 (the machine's python3 here is 3.11), or None."""
    import shutil
    for name in ("python3.11", "python3", "python3.13", "python3.10"):
        exe = shutil.which(name)
        if exe:
            r = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:2])"],
                               capture_output=True, text=True)
            if r.returncode == 0 and r.stdout.split() != ["3", "12"]:
                return exe
    return None


def test_gather_and_check_need_python_312(tmp_path):
    assert h200.python_for_wheels((3, 12)) is None
    venv = REPO / ".venv" / "bin" / "python"
    assert h200.python_for_wheels((3, 11), venv) == str(venv)
    with pytest.raises(SystemExit, match=r"need Python 3\.12 .*this is 3\.11 .*make setup"):
        h200.python_for_wheels((3, 11), tmp_path / "no-python")
    exe = _other_python()
    if exe is None:
        pytest.skip("no Python other than 3.12 on this machine")
    # `check` from a 3.11: re-run with the project's 3.12, which then finds no wheels (offline)
    r = subprocess.run([exe, str(REPO / "scripts" / "h200_first_contact.py"), "check",
                        "--imports-only", "--wheels", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert "gather and check need 3.12: re-running with" in r.stderr, r.stderr
    assert r.returncode == 1 and "lacks megatron-core, mlperf-logging" in r.stderr
    # `run` (installing) from a 3.11 is refused before pip, naming the version
    r = subprocess.run([exe, str(REPO / "scripts" / "h200_first_contact.py"), "run",
                        str(tmp_path / "out"), "--wheels", str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "the wheels are for CPython 3.12" in r.stdout, r.stdout
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.slow
def test_the_wheel_list_resolves_from_a_clean_path(tmp_path):
    """The project imports from a path holding only the repository, the carried packages and
    the image's (links to this environment's installs, the same megatron-core and mlperf-logging
    versions as the wheels); without mlperf-logging it would not."""
    import importlib.metadata as md
    for n, v in h200.WHEELS.items():
        assert md.version(n) == v
    linked, absent = h200.link_dists(tmp_path / "wheels", h200.WHEELS)
    assert linked == sorted(h200.WHEELS) and not absent
    _, image_absent = h200.image_site(tmp_path / "image")
    assert "torch" not in image_absent and "numpy" not in image_absent
    path = [str(REPO), str(tmp_path / "wheels"), str(tmp_path / "image")]
    assert h200.probe(path, image_absent) == {}
    partial = {k: v for k, v in h200.WHEELS.items() if k != "mlperf-logging"}
    h200.link_dists(tmp_path / "less", partial)
    missing = h200.probe([str(REPO), str(tmp_path / "less"), str(tmp_path / "image")],
                         image_absent, modules=["mlperf_logging.mllog", "llama31_405b.train.loop"])
    assert missing and all("mlperf_logging" in m for m in missing.values()), missing


@pytest.mark.slow
def test_the_device_command_writes_its_files_within_the_deadline(tmp_path, monkeypatch):
    """`run` end to end where no GPU is visible (--no-install: this environment has the
    packages): every phase process reports, the merged report and summary are written, and the
    whole command keeps to its deadline. Then a phase rerun alone into the same folder (and dp2
    on a machine whose nvidia-smi lists one GPU): new files, the first run's untouched."""
    import sys
    import time

    from conftest import py_env
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "h200_first_contact.py"), "run",
                        str(out), "--no-install", "--deadline-s", "300"], cwd=tmp_path,
                       env=py_env(), capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert time.monotonic() - t0 < 300         # a loaded 2-core CI machine: above DEADLINE_S
    files = sorted(f.name for f in out.iterdir())
    assert files == ["dp2.json", "env.txt", "layer.json", "log.txt", "report.json",
                     "slice.json", "summary.txt"]
    assert len(files) <= 8                       # what the device tool brings back
    doc = json.loads((out / "report.json").read_text())
    assert {c["status"] for c in doc["checks"]} == {"not run"}
    assert all("no CUDA device visible" in c["detail"] for c in doc["checks"])
    assert "0 failed, 0 passed" in (out / "summary.txt").read_text()

    first = {f.name: f.read_bytes() for f in out.iterdir()}
    _report(out / "layer.json", {"nvfp4_emulation": ("passed", "measured by layer")})
    first["layer.json"] = (out / "layer.json").read_bytes()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")     # run() puts the repository on the path
    rc = h200.run(out, REPO / ".whl", 300,
                  str(REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"),
                  install=False, phases=["slice", "dp2"], gpus=1)
    assert rc == 0
    assert {f.name: f.read_bytes() for f in out.iterdir() if f.name in first} == first
    assert sorted(set(f.name for f in out.iterdir()) - set(first)) == [
        "dp2.2.json", "env.2.txt", "log.2.txt", "report.2.json", "slice.2.json", "summary.2.txt"]
    by = {c["name"]: c for c in json.loads((out / "report.2.json").read_text())["checks"]}
    assert by["nvfp4_emulation"]["detail"] == "measured by layer"     # the first run's layer
    assert by["build"]["detail"].startswith("no CUDA device visible")
    assert by["dp2_eval_sync"]["detail"] == "needs 2 GPUs (nvidia-smi -L lists 1): not started"
    assert "phase dp2: needs 2 GPUs" in (out / "log.2.txt").read_text()
