"""Every data file a checkpoint's `.metadata` names: present, and as long as it records.

torch.distributed.checkpoint's `.metadata` (torch 2.13: a pickled
`torch.distributed.checkpoint.metadata.Metadata`, read by `FileSystemReader.read_metadata`) maps
each stored chunk (`MetadataIndex`) in `storage_data` to a `filesystem._StorageInfo(relative_path,
offset, length)`: the file under the checkpoint folder that holds it, where and how many bytes.
megatron-core 0.19.2's torch_dist strategy writes exactly that index (its
`FileSystemWriterAsync` records the same `_StorageInfo`s). A data file deleted or cut short
(an interrupted copy) is otherwise found only inside the load, after the model is built, as
torch's raw FileNotFoundError on some rank; here it is found from the index and `stat` alone,
no tensor read, so `train`'s cheap pre-check (train.inputs) refuses it by name.
"""
from __future__ import annotations

from pathlib import Path

DCP_METADATA = ".metadata"
"""torch DCP's index (checkpoint.format names it too, and calls this module)."""


def read_index(path: str | Path):
    """The checkpoint's `.metadata` (torch DCP's Metadata); ValueError when it cannot be read."""
    from torch.distributed.checkpoint import FileSystemReader
    try:
        return FileSystemReader(str(path)).read_metadata()
    except Exception as e:   # noqa: BLE001 - an unpickling error may be of any type
        raise ValueError(f"{DCP_METADATA} cannot be read ({type(e).__name__}: {e})") from None


def recorded_sizes(metadata) -> dict[str, int]:
    """relative path -> the bytes the index says the file holds at least (the end of its last
    recorded chunk)."""
    ends: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        name = getattr(info, "relative_path", None)
        if not name:
            continue
        end = int(getattr(info, "offset", 0) or 0) + int(getattr(info, "length", 0) or 0)
        ends[name] = max(ends.get(name, 0), end)
    return ends


def file_problems(path: str | Path) -> list[str]:
    """What is wrong with the data files the checkpoint at `path` names: 'x.distcp: missing',
    'x.distcp: 1024 bytes, the index records 4096' (empty: every file there and long enough).
    ValueError when the index itself cannot be read."""
    p = Path(path)
    out = []
    for name, size in sorted(recorded_sizes(read_index(p)).items()):
        try:
            have = (p / name).stat().st_size
        except FileNotFoundError:
            out.append(f"{name}: missing")
            continue
        except OSError as e:
            out.append(f"{name}: cannot be read ({e.strerror or e})")
            continue
        if have < size:
            out.append(f"{name}: {have} bytes, the index records {size}")
    return out
