"""docs/gpu_settings.md and the shipped GB200 configs say the same thing: every row whose "where"
column names a place is checked against the 8-rack config (the scale of the proven run), and
every other GB200 config agrees with it except on rows marked "per scale"."""
from __future__ import annotations

from pathlib import Path

import pytest

from llama31_405b.config import load_config
from llama31_405b.config.env import launch_env
from llama31_405b.launch.plan import launch_plan
from llama31_405b.model.builder import ddp_config

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "gpu_settings.md"
PROVEN_SCALE = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"
COLUMNS = ("setting", "proven", "ours", "where", "why")


def rows() -> list[dict]:
    """The table rows of the page (five cells; the header and rule rows left out)."""
    out = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == len(COLUMNS) and cells[0] != "setting" and not set(cells[0]) <= {"-"}:
            out.append(dict(zip(COLUMNS, cells)))
    return out


def checked_rows() -> list[dict]:
    return [r for r in rows() if r["where"] != "-"]


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def value_at(cfg, where: str) -> str:
    kind, _, name = where.strip("`").partition(":")
    if kind == "config":
        obj = cfg
        for part in name.split("."):
            obj = getattr(obj, part)
        return _text(obj)
    if kind == "ddp":
        return _text(getattr(ddp_config(cfg), name))
    if kind == "env":
        return launch_env(cfg).get(name, "<unset>")
    if kind == "plan":
        return _text(getattr(launch_plan(cfg), name))
    if kind == "script":
        return (REPO / name).read_text()
    raise AssertionError(f"docs/gpu_settings.md: unknown place {where!r}")


def test_the_table_is_there_and_covers_the_reference_environment():
    names = {r["where"].strip("`").partition(":")[2] for r in checked_rows()
             if r["where"].startswith("`env:")}
    for var in ("CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_NVLS_ENABLE", "NCCL_MIN_NCHANNELS",
                "NCCL_MIN_CTAS", "NCCL_MAX_CTAS", "NCCL_P2P_NET_CHUNKSIZE", "NCCL_WORK_FIFO_DEPTH",
                "NCCL_SHARP_GROUP_SIZE_THRESH", "NCCL_GRAPH_REGISTER", "NCCL_LOCAL_REGISTER",
                "PYTORCH_CUDA_ALLOC_CONF", "TORCH_NCCL_AVOID_RECORD_STREAMS",
                "NVTE_FWD_LAYERNORM_SM_MARGIN", "NVTE_BWD_LAYERNORM_SM_MARGIN",
                "NVTE_NORM_FWD_USE_CUDNN", "NVTE_NORM_BWD_USE_CUDNN", "NVTE_DPA_FP8_RECIPE"):
        assert var in names, f"docs/gpu_settings.md has no row for {var}"
    assert len(rows()) >= 40


@pytest.mark.parametrize("row", checked_rows(), ids=lambda r: r["setting"])
def test_the_8_rack_config_has_the_value_the_table_gives(row):
    cfg = load_config(PROVEN_SCALE)
    want = row["ours"].strip("`")
    have = value_at(cfg, row["where"])
    if row["where"].startswith("`script:"):
        for flag in want.split():
            assert flag in have, f"{row['where']} lacks {flag} ({row['setting']})"
    else:
        assert have == want, f"{row['setting']}: docs/gpu_settings.md says {want}, the config {have}"


def test_every_gb200_config_agrees_with_the_8_rack_one():
    ref = load_config(PROVEN_SCALE)
    for path in sorted((REPO / "configs").glob("config_GB200_*.toml")):
        cfg = load_config(path)
        for r in checked_rows():
            if "per scale" in r["why"] or r["where"].startswith("`script:"):
                continue
            assert value_at(cfg, r["where"]) == value_at(ref, r["where"]), (
                f"{path.name}: {r['setting']} differs from the 8-rack config")
