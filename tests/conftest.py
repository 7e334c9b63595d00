"""Shared fixtures. Expensive ones (tiny data, init checkpoint, tiny runs) are session-scoped."""
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
