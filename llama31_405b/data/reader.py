"""Reading C4-format shards: one JSON object per line with a "text" field, gzip-compressed
(`.json.gz`) or plain (`.json`, `.jsonl`).

Every problem names the file and line. A malformed line or a line without a string "text" is an
error unless the caller asked to skip such lines (`skip_bad=True`, counted in `SkipCounts`). A
truncated or corrupt gzip stream is always an error: documents after the break would be lost
silently. Blank lines are ignored; an empty "text" yields no document (counted as `empty`).
"""
from __future__ import annotations

import gzip
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

    def _hint(self) -> str:
        return ("; fix or remove the line, or pass --skip-bad to skip and count such lines"
                if not self.skip_bad else "")

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
                kind = ("truncated gzip stream" if isinstance(e, EOFError)
                        else f"corrupt gzip data ({e})")
                raise DataError(f"{self.path}:{lineno + 1}: {kind} after {lineno} complete lines; "
                                "the shard is damaged: download or copy it again") from None

    def _text(self, line: bytes, lineno: int) -> str | None:
        try:
            obj = json.loads(line)
        except (ValueError, UnicodeDecodeError) as e:
            if self.skip_bad:
                self.counts.malformed += 1
                return None
            raise DataError(f"{self.path}:{lineno}: malformed JSON line ({e}){self._hint()}") from None
        text = obj.get("text") if isinstance(obj, dict) else None
        if not isinstance(text, str):
            if self.skip_bad:
                self.counts.missing_text += 1
                return None
            what = "not a JSON object" if not isinstance(obj, dict) else (
                'no "text" field' if "text" not in obj else '"text" is not a string')
            raise DataError(f"{self.path}:{lineno}: {what}{self._hint()}")
        return text
