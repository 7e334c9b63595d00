"""Reading C4-format shards: one JSON object per line with a "text" field, gzip-compressed
(`.json.gz`) or plain (`.json`, `.jsonl`).

Every problem names the file and line. A malformed line or a line without a string "text" is an
error unless the caller asked to skip such lines (`skip_bad=True`, counted in `SkipCounts`). A
truncated or corrupt gzip stream is always an error: documents after the break would be lost
silently. Blank lines are ignored; an empty "text" yields no document (counted as `empty`).
"""
from __future__ import annotations

import gzip
import io
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import DataError


@dataclass
class SkipCounts:
    malformed: int = 0
    """Lines that are not a JSON object (skipped on request)."""
    missing_text: int = 0
    """JSON objects without a string "text" (skipped on request)."""
    empty: int = 0
    """Documents whose text is empty (never produce tokens)."""

    def add(self, other: "SkipCounts") -> None:
        self.malformed += other.malformed
        self.missing_text += other.missing_text
        self.empty += other.empty

    def total(self) -> int:
        return self.malformed + self.missing_text + self.empty


class ShardReader:
    """Iterates the texts of one shard; `position` is the compressed bytes read so far."""

    def __init__(self, path: str | Path, *, skip_bad: bool = False) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"{self.path}: input shard not found")
        self.skip_bad = skip_bad
        self.counts = SkipCounts()
        self.lines = 0
        self._raw: BinaryIO | None = None

    @property
    def position(self) -> int:
        return self._raw.tell() if self._raw is not None and not self._raw.closed else 0

    def __iter__(self) -> Iterator[str]:
        gz = self.path.name.endswith(".gz")
        with open(self.path, "rb") as raw:
            self._raw = raw
            stream = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
            lineno = 0
            try:
                for lineno, line in enumerate(stream, 1):
                    self.lines = lineno
                    if not line.strip():
                        continue
                    text = self._text(line, lineno)
                    if text is None:
                        continue
                    if not text:
                        self.counts.empty += 1
                        continue
                    yield text
            except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
                raise _gzip_error(self.path, e, lineno) from None

    def _text(self, line: bytes, lineno: int) -> str | None:
        text = parse_line(line)
        if isinstance(text, str):
            return text
        kind, what = text
        if self.skip_bad:
            setattr(self.counts, kind, getattr(self.counts, kind) + 1)
            return None
        raise DataError(f"{self.path}:{lineno}: {what}{hint(self.skip_bad)}")


def hint(skip_bad: bool) -> str:
    return ("; fix or remove the line, or pass --skip-bad to skip and count such lines"
            if not skip_bad else "")


def parse_line(line: bytes) -> str | tuple[str, str]:
    """The "text" of one JSON line, or (kind, what is wrong): kind "malformed" (not JSON) or
    "missing_text" (no string "text")."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        return "malformed", f"malformed JSON line ({e})"
    text = obj.get("text") if isinstance(obj, dict) else None
    if not isinstance(text, str):
        return "missing_text", ("not a JSON object" if not isinstance(obj, dict) else
                                'no "text" field' if "text" not in obj else '"text" is not a string')
    return text


def _gzip_error(path: Path, e: BaseException, lines: int) -> DataError:
    kind = "truncated gzip stream" if isinstance(e, EOFError) else f"corrupt gzip data ({e})"
    return DataError(f"{path}:{lines + 1}: {kind} after {lines} complete lines; "
                     "the shard is damaged: download or copy it again")


class BlockReader:
    """Iterates a shard as blocks of whole lines: (number of the block's first line, bytes of
    about `block_bytes` ending with a newline; the shard's last line may lack it). `lines`: the
    lines read so far; `position`: compressed bytes read.

    The stream is read as GzipFile's line iterator reads it (`read1` of io.DEFAULT_BUFFER_SIZE
    through the same buffered reader), so a damaged stream stops after the same data and the
    error names the same line (ShardReader's message). The lines before the damage come first,
    as a block. A line longer than a block is one block (read in linear time)."""

    def __init__(self, path: str | Path, block_bytes: int) -> None:
        self.path = Path(path)
        self.block_bytes = block_bytes
        self.lines = 0
        self._raw: BinaryIO | None = None

    @property
    def position(self) -> int:
        return self._raw.tell() if self._raw is not None and not self._raw.closed else 0

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        gz = self.path.name.endswith(".gz")
        with open(self.path, "rb") as raw:
            self._raw = raw
            stream = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
            pieces: list[bytes] = []
            size = 0
            newline = False  # a newline in pieces
            try:
                while True:
                    chunk = stream.read1(io.DEFAULT_BUFFER_SIZE)
                    if not chunk:
                        break
                    pieces.append(chunk)
                    size += len(chunk)
                    newline = newline or b"\n" in chunk
                    if size >= self.block_bytes and newline:
                        first = self.lines + 1
                        block, pieces = self._cut(pieces)
                        size, newline = sum(map(len, pieces)), False
                        yield first, block
            except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
                if newline:
                    first = self.lines + 1
                    block, pieces = self._cut(pieces)
                    yield first, block
                raise _gzip_error(self.path, e, self.lines) from None
            tail = b"".join(pieces)
            if tail:
                first = self.lines + 1
                self.lines += tail.count(b"\n") + (not tail.endswith(b"\n"))
                yield first, tail

    def _cut(self, pieces: list[bytes]) -> tuple[bytes, list[bytes]]:
        data = b"".join(pieces)
        cut = data.rfind(b"\n") + 1
        self.lines += data.count(b"\n", 0, cut)
        return data[:cut], ([data[cut:]] if cut < len(data) else [])
