"""Sentencepiece tokenizer: one class for Mixtral 8x22B's model (full scale) and the tiny one.

The object duck-types what Megatron's GPTDataset needs (`eod`, `vocab_size`, `pad`,
`unique_identifiers`) plus `bos`, `tokenize` and `detokenize`. Special ids come from the model:
Mixtral's has unk 0, bos 1, eos 2 and no pad piece (`pad == -1`, Megatron's "no pad" value,
so GPTDataset never masks a real token as padding). `eod` is the eos id: it is what `data
prepare` appends after every document. The tiny model is trained with the same special ids.
"""
from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Iterable

from .errors import DataError


def file_sha256(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class SentencePieceTokenizer:
    """A sentencepiece model file wrapped for data preparation and Megatron datasets."""

    def __init__(self, path: str | Path) -> None:
        import sentencepiece as spm
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"tokenizer {self.path}: file not found. Full scale: put the Mixtral "
                            "8x22B tokenizer.model there (it ships with MLCommons' data); tiny: "
                            "run `python -m llama31_405b data tiny`")
        self.sha256 = file_sha256(self.path)
        try:
            self._sp = spm.SentencePieceProcessor(model_file=str(self.path))
        except (RuntimeError, OSError) as e:
            raise DataError(f"tokenizer {self.path}: not a sentencepiece model ({e})") from None
        self.vocab_size: int = self._sp.get_piece_size()
        self.bos: int = self._sp.bos_id()
        self.eod: int = self._sp.eos_id()
        self.pad: int = self._sp.pad_id()
        self.unk: int = self._sp.unk_id()
        if self.eod < 0:
            raise DataError(f"tokenizer {self.path}: the model has no eos piece, which every "
                            "document ends with (EOD); use a model trained with an eos id")
        self.unique_identifiers = {"class": "SentencePieceTokenizer", "sha256": self.sha256,
                                   "vocab_size": self.vocab_size, "eod": self.eod}

    @property
    def eos(self) -> int:
        return self.eod

    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` without bos or eos (the dataset appends eod itself)."""
        return self._sp.encode(text)

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of several texts, encoded on the calling thread only."""
        return self._sp.encode(texts, num_threads=1)

    def detokenize(self, ids: Iterable[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    def __getstate__(self) -> dict:  # worker processes and deep copies reload from the file
        return {"path": str(self.path)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    def __repr__(self) -> str:
        return (f"SentencePieceTokenizer({str(self.path)!r}, vocab_size={self.vocab_size}, "
                f"bos={self.bos}, eod={self.eod}, pad={self.pad})")


def load_tokenizer(path: str | Path) -> SentencePieceTokenizer:
    """The tokenizer at `path` (a sentencepiece .model file)."""
    return SentencePieceTokenizer(path)


def train_tokenizer(texts: Iterable[str], out_path: str | Path, *, vocab_size: int) -> Path:
    """Train a byte-fallback BPE sentencepiece model like Mixtral's (unk 0, bos 1, eos 2, no pad).

    One training thread: sentencepiece's result depends on the thread count, and the tiny
    tokenizer must be the same file on every machine. Written under a temporary name and renamed.
    """
    import sentencepiece as spm
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=buf, vocab_size=vocab_size,
        model_type="bpe", byte_fallback=True, character_coverage=0.9995,
        split_digits=True, allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
        max_sentence_length=1 << 20, minloglevel=2)
    tmp = out_path.with_name(out_path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, out_path)
    return out_path
