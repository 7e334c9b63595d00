"""Read a Hugging Face checkpoint directory one tensor at a time.

A Hugging Face Llama directory holds `config.json` and either one `model.safetensors` or shards
named by `model.safetensors.index.json`. Only the safetensors headers are read up front (names,
dtypes, shapes: a few MB for 405B); tensor data is read on demand, one tensor per call, through
`safetensors.safe_open`, and the file is closed again after each read so that no mapping of a
multi-GB shard stays resident between reads.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

# bytes per element of the safetensors dtypes a Llama checkpoint can hold
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
               "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


class HFCheckpointError(ValueError):
    """The Hugging Face directory is unreadable or inconsistent; the message names the file."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    file: Path
    dtype: str
    """safetensors dtype string (BF16, F32, ...)."""
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES.get(self.dtype, 1)


class HFCheckpoint:
    """The tensor index and config of a Hugging Face checkpoint directory."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        if not self.dir.is_dir():
            raise HFCheckpointError(f"{self.dir}: not a directory (expected a Hugging Face "
                                    "checkpoint with config.json and *.safetensors)")
        self.config = self._read_config()
        self.tensors: dict[str, TensorInfo] = {}
        for path in self._files():
            self._index_file(path)
        if not self.tensors:
            raise HFCheckpointError(f"{self.dir}: no tensors in the safetensors files")

    def _read_config(self) -> dict:
        path = self.dir / "config.json"
        if not path.is_file():
            raise HFCheckpointError(f"{path}: missing (every Hugging Face model directory has one)")
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise HFCheckpointError(f"{path}: not valid JSON: {e}") from None

    def _files(self) -> list[Path]:
        index = self.dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise HFCheckpointError(f"{index}: no valid 'weight_map' ({e})") from None
            files = sorted({self.dir / f for f in weight_map.values()})
            missing = [str(f) for f in files if not f.is_file()]
            if missing:
                raise HFCheckpointError(f"{index} names shard files that do not exist: "
                                        f"{', '.join(missing[:5])}")
            return files
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise HFCheckpointError(f"{self.dir}: no *.safetensors files (PyTorch .bin checkpoints "
                                    "are not supported; re-save with safe_serialization=True)")
        return files

    def _index_file(self, path: Path) -> None:
        from safetensors import safe_open
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    sl = f.get_slice(name)
                    info = TensorInfo(name=name, file=path, dtype=sl.get_dtype(),
                                      shape=tuple(sl.get_shape()))
                    if name in self.tensors:
                        raise HFCheckpointError(f"tensor {name!r} is stored twice: in "
                                                f"{self.tensors[name].file} and {path}")
                    self.tensors[name] = info
        except HFCheckpointError:
            raise
        except Exception as e:  # safetensors raises its own error types for corrupt headers
            raise HFCheckpointError(f"{path}: unreadable safetensors file: {e}") from None

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def read(self, name: str):
        """The tensor `name` as a torch tensor in its stored dtype (one read, file closed after)."""
        from safetensors import safe_open
        info = self.tensors[name]
        with safe_open(str(info.file), framework="pt") as f:
            return f.get_tensor(name)
