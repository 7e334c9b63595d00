"""docs/gpu_settings.md and the shipped GB200 configs say the same thing: every row whose "where"
column names a place is checked against the 8-rack config (the scale of the proven run), and
every other GB200 config agrees with it except on rows marked "per scale". The "on CPU" column
names, for every row, the CPU test that exercises the row's value (checked against the config
that test runs) or why the setting is GPU only."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from llama31_405b.config import load_config
from llama31_405b.config.env import launch_env
from llama31_405b.launch.plan import launch_plan
from llama31_405b.model.builder import ddp_config

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "gpu_settings.md"
PROVEN_SCALE = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"
COLUMNS = {"setting": "setting", "proven GB200 run": "proven", "ours": "ours", "where": "where",
           "on CPU": "cpu", "why ours differs": "why"}
"""Header text -> key, for every column each table must have (in any order)."""
EXERCISED = re.compile(r"exercised on CPU by `(tests/[\w/]+\.py)::(\w+)`")
GPU_ONLY = re.compile(r"GPU only: \S")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def rows() -> list[dict]:
    """The rows of every table of the page, as dicts keyed by COLUMNS, each checked against its
    table's header (a row with a missing or extra cell fails here, naming it)."""
    out, header = [], None
    for n, line in enumerate(DOC.read_text().splitlines(), 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            assert set(cells) == set(COLUMNS), (
                f"docs/gpu_settings.md:{n}: table header {cells}, expected the columns {list(COLUMNS)}")
            header = [COLUMNS[c] for c in cells]
        elif all(set(c) <= {"-", ":"} and c for c in cells):
            continue                                            # the rule under the header
        else:
            assert len(cells) == len(header), (
                f"docs/gpu_settings.md:{n}: {len(cells)} cells, the table has {len(header)} columns")
            out.append(dict(zip(header, cells)))
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


# -- the "on CPU" column ----------------------------------------------------------------------

def _test_module(path: str) -> str:
    file = REPO / path
    assert file.is_file(), f"docs/gpu_settings.md names {path}, which does not exist"
    return file.read_text()


def cpu_config_of(path: str):
    """The config the named test module runs: its GB200_CPU_CONFIG (a path from the repository
    root)."""
    m = re.search(r'^GB200_CPU_CONFIG = "([^"]+)"', _test_module(path), re.M)
    assert m, f"{path} declares no GB200_CPU_CONFIG = \"configs/...\" (the config it runs)"
    return load_config(REPO / m.group(1))


def test_every_row_says_where_it_runs_on_cpu():
    for r in rows():
        assert EXERCISED.fullmatch(r["cpu"].split(" (")[0]) or GPU_ONLY.match(r["cpu"]), (
            f"{r['setting']}: the \"on CPU\" column must read \"exercised on CPU by "
            f"`tests/<file>.py::<test>`\" or \"GPU only: <why>\", not {r['cpu']!r}")


@pytest.mark.parametrize("row", [r for r in rows() if r["cpu"].startswith("exercised")],
                         ids=lambda r: r["setting"])
def test_the_cpu_test_exists_and_its_config_has_the_value(row):
    path, name = EXERCISED.match(row["cpu"]).groups()
    assert re.search(rf"^def {name}\(", _test_module(path), re.M), f"{path} has no test {name}"
    if row["where"] == "-" or row["where"].startswith("`script:"):
        return
    cfg = cpu_config_of(path)
    want = row["ours"].strip("`")
    have = value_at(cfg, row["where"])
    assert have == want, (f"{row['setting']}: exercised on CPU by {path}, whose config "
                          f"{cfg.source} has {have}, not the GB200 value {want}")


def test_the_cpu_gb200_config_runs_on_cpu_and_is_exercised():
    """The GB200 CPU config is a CPU config that exercises most of the table's settings."""
    cfg = cpu_config_of("tests/test_train_eval_sync.py")
    assert cfg.derived.system.is_gpu is False and cfg.derived.dp >= 2
    exercised = [r for r in rows() if r["cpu"].startswith("exercised")]
    assert len(exercised) >= 20
