"""The variables `make coverage` sets (COVERAGE_PROCESS_START, COVERAGE_FILE) and those coverage.py
passes on to subprocesses (COVERAGE_PROCESS_CONFIG), for a test that starts a Python process with
an environment built from scratch: with them the process is measured too (docs/coverage.md).
Empty outside `make coverage`."""
from __future__ import annotations

import os


def coverage_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("COVERAGE_")}
