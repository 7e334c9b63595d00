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
    assert by["layer_bf16"]["detail"] == "phase layer left no report"
    assert doc["summary"] == {"passed": 2, "failed": 0, "not run": 4}
    assert lines[-1] == "0 failed, 2 passed, 4 not run"


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
def test_the_device_command_writes_its_files_within_the_deadline(tmp_path):
    """`run` end to end where no GPU is visible (--no-install: this environment has the
    packages): every phase process reports, the merged report and summary are written, and the
    whole command keeps to its deadline."""
    import sys
    import time

    from conftest import py_env
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "h200_first_contact.py"), "run",
                        str(out), "--no-install", "--deadline-s", "240"], cwd=tmp_path,
                       env=py_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert time.monotonic() - t0 < 240
    files = sorted(f.name for f in out.iterdir())
    assert files == ["dp2.json", "env.txt", "layer.json", "log.txt", "report.json",
                     "slice.json", "summary.txt"]
    assert len(files) <= 8                       # what the device tool brings back
    doc = json.loads((out / "report.json").read_text())
    assert {c["status"] for c in doc["checks"]} == {"not run"}
    assert all("no CUDA device visible" in c["detail"] for c in doc["checks"])
    assert "0 failed, 0 passed" in (out / "summary.txt").read_text()
