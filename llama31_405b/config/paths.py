"""Files shipped beside the configs (configs/...), found alike in a checkout and in the image.

A config names such a file relative to the repository's `configs/` directory (e.g.
`performance.nccl_communicator_config = "nccl/gb200_communicators.yaml"`). The directory is the
one next to this package; in the container, where `python -m llama31_405b` runs from the image's
WORKDIR (a copy of the repository), `./configs` is tried as well.
"""
from __future__ import annotations

from pathlib import Path

from .load import ConfigError

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"


def shipped_file(value: str, *, key: str) -> Path:
    """The file `value` names (absolute, or relative to configs/); ConfigError naming `key`."""
    path = Path(value)
    if path.is_absolute():
        candidates = [path]
    else:
        candidates = list(dict.fromkeys([CONFIGS_DIR / path, Path.cwd() / "configs" / path]))
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise ConfigError(f"{key} = {value!r}: no such file ({', '.join(map(str, candidates))}); "
                      "a relative path is resolved against the repository's configs/ directory")
