"""Helpers for tests on real MLPerf logs: the published v5.1 fixture and edited copies of it.

Edits change only what a test is about (one header value, a removed line, a broken line)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llama31_405b.mlperf.log import TOKEN

_REPO = Path(__file__).resolve().parents[1]
_NAME = "mlperf_v5.1_llama31_405b_uf_b200_n32"
FIXTURE = _REPO / "tests" / "fixtures" / _NAME   # source and licence: its README.md
LOGS = [FIXTURE / f"result_{i}.txt" for i in range(3)]
SYSTEM_JSON = FIXTURE / "hpg.dgxb200x8.n32.json"
ORG = "University-of-Florida"


def need_fixture() -> None:
    """The published logs are part of the repository: missing means a broken checkout."""
    if not FIXTURE.is_dir():
        pytest.fail(f"real MLPerf v5.1 logs not found at {FIXTURE}: the checkout is incomplete")


def copy_logs(dst: Path) -> list[Path]:
    dst.mkdir(parents=True, exist_ok=True)
    out = []
    for p in LOGS:
        shutil.copyfile(p, dst / p.name)
        out.append(dst / p.name)
    return out


def set_value(path: Path, key: str, value) -> None:
    """Rewrite the value of the (first) MLLOG line with `key`."""
    lines = path.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        pos = line.find(TOKEN)
        if pos >= 0 and f'"key": "{key}"' in line:
            rec = json.loads(line[pos + len(TOKEN):])
            rec["value"] = value
            lines[i] = line[:pos] + TOKEN + json.dumps(rec) + "\n"
            path.write_text("".join(lines))
            return
    raise KeyError(key)


def drop_key(path: Path, key: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(ln for ln in lines if f'"key": "{key}"' not in ln))


def line_of(path: Path, key: str) -> int:
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if f'"key": "{key}"' in line:
            return i
    raise KeyError(key)


def set_last_value(path: Path, key: str, value, **metadata) -> None:
    """Rewrite the value (and metadata entries) of the LAST MLLOG line with `key`."""
    lines = path.read_text().splitlines(keepends=True)
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        pos = line.find(TOKEN)
        if pos >= 0 and f'"key": "{key}"' in line:
            rec = json.loads(line[pos + len(TOKEN):])
            rec["value"] = value
            rec["metadata"].update(metadata)
            lines[i] = line[:pos] + TOKEN + json.dumps(rec) + "\n"
            path.write_text("".join(lines))
            return
    raise KeyError(key)
