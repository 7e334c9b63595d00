"""The run's inputs checked first: what `train` can check in a second before it builds the model,
reads a tensor or touches the dataset's contents (train.loop runs this right after the placement
check, before the model build).

- the data (data.verify): data_dir, the tokenizer, every .bin/.idx present and of the size its
  .idx header says, the validation set large enough, and, unless `data.require_verified = false`,
  a passing verification in the manifest with files unchanged since. Metadata only (the
  manifest, the tokenizer, .idx headers, stat): MLPerf's rules allow it before run_start;
- the initial checkpoint's record (checkpoint.format.check_compatible): its files present, its
  `llama31_405b.json` of this model, and every data file its torch DCP index names present and
  as long as the index records (checkpoint.data_files); no tensor is read.

Every message names the config key (or option) as well as the path; a suggested `data verify`
command carries the user's --set overrides.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config.schema import Config


@dataclass(frozen=True)
class CheckedInputs:
    verified: dict[str, Any] | None
    """require_verified's records by manifest key (None: data.require_verified = false): parsed
    JSON of the data manifest (data.verify), hence Any."""
    checkpoint: str
    """The initial checkpoint to load ('' for none)."""


def checkpoint_path(cfg: Config, given: str | None) -> tuple[str, str]:
    """(path, what names it): `given` (the --init-checkpoint option) or the config's
    checkpoint.ckpt_dir/checkpoint.init."""
    if given is not None:
        return given, "--init-checkpoint"
    return str(Path(cfg.checkpoint.ckpt_dir) / cfg.checkpoint.init), \
        "checkpoint.ckpt_dir/checkpoint.init"


def check_inputs(cfg: Config, *, init_checkpoint: str | None, sets: Sequence[str] = (),
                 data: bool = True) -> CheckedInputs:
    """Raise DataError / CheckpointError (naming key and path) for inputs that cannot work.
    `data=False`: the caller brings its datasets (tiny pre-training), skip the data."""
    verified = None
    if data:
        from ..data.verify import check_metadata, require_verified
        if cfg.data.require_verified:
            verified = require_verified(cfg, sets)["datasets"]
        else:
            check_metadata(cfg)
    ckpt, key = checkpoint_path(cfg, init_checkpoint)
    if ckpt:
        from ..checkpoint.format import check_compatible
        check_compatible(ckpt, cfg, key=key)
    return CheckedInputs(verified=verified, checkpoint=ckpt)
