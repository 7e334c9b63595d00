"""Sentencepiece tokenizer: one class for Mixtral 8x22B's model (full scale) and the tiny one.

The object duck-types what Megatron's GPTDataset needs (`eod`, `vocab_size`, `pad`,
`unique_identifiers`) plus `bos`, `tokenize` and `detokenize`. Special ids come from the model:
Mixtral's has unk 0, bos 1, eos 2 and no pad piece (`pad == -1`, Megatron's "no pad" value,
so GPTDataset never masks a real token as padding). `eod` is the eos id, which `data prepare`
appends after every document only with `--append-eod`. The tiny model has the same special ids.

`tokenize` gives the ids of the MLPerf reference's tokenizer path, not bare sentencepiece. The
reference (mlcommons/training, `large_language_model_pretraining/nemo/utils/preprocess.sh`)
tokenizes through NeMo's Hugging Face wrapper: `AutoTokenizer.text_to_ids(text)` in
nemo-toolkit is `tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))` on a transformers
tokenizer of the Mixtral folder. A transformers tokenizer first cuts the text at the strings of
its special tokens (`<unk>`, `<s>`, `</s>`), maps each to its id, and encodes every piece in
between on its own with the sentencepiece model (Llama's "legacy" behaviour: each piece gets
the dummy-prefix space). Bare `SentencePieceProcessor.encode` treats `</s>` in the text as
ordinary characters. Both agree on text without those strings; `tokenize` does the former, and
`tests/test_data_tokenizer.py` checks it against transformers (fast tokenizer built from the
model by `LlamaConverter`, and the sentencepiece-backed slow tokenizer) id for id.
"""
from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path
from typing import Iterable

from .errors import DataError

TOKENIZATION = "hf-compatible-1"
"""Label of what `tokenize` does, recorded with prepared data: a change invalidates old parts."""


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
            raise DataError(f"tokenizer {self.path}: the model has no eos piece, which Megatron's "
                            "GPTDataset needs as its end-of-document id; use a model trained with "
                            "an eos id")
        # the strings a transformers tokenizer of this model splits out as special tokens
        self.special_pieces = {self._sp.id_to_piece(i): i for i in range(self.vocab_size)
                               if self._sp.is_control(i) or self._sp.is_unknown(i)}
        self._special_re = re.compile("|".join(
            re.escape(p) for p in sorted(self.special_pieces, key=len, reverse=True))
        ) if self.special_pieces else None
        self._special_first = sorted({p[0] for p in self.special_pieces})
        self.unique_identifiers = {"class": "SentencePieceTokenizer", "sha256": self.sha256,
                                   "vocab_size": self.vocab_size, "eod": self.eod}

    @property
    def eos(self) -> int:
        return self.eod

    def tokenize(self, text: str) -> list[int]:
        """Ids of `text` as the reference's tokenizer path gives them (module docstring): no
        bos or eos added; special-token strings in the text become their ids."""
        return self.tokenize_batch([text])[0]

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        """`tokenize` of several texts, encoded on the calling thread only."""
        out = self._sp.encode(texts, num_threads=1)
        if self._special_re is not None:
            for k, text in enumerate(texts):
                if any(c in text for c in self._special_first) and self._special_re.search(text):
                    out[k] = self._split_encode(text)
        return out

    def encode_plain(self, text: str) -> list[int]:
        """Bare sentencepiece ids (special-token strings encoded as ordinary text)."""
        return self._sp.encode(text)

    def _split_encode(self, text: str) -> list[int]:
        ids: list[int] = []
        pos = 0
        if self._special_re is None:   # no special tokens (tokenize_batch asks only otherwise)
            return self._sp.encode(text)
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                ids += self._sp.encode(text[pos:m.start()])
            ids.append(self.special_pieces[m.group()])
            pos = m.end()
        if pos < len(text):
            ids += self._sp.encode(text[pos:])
        return ids

    def detokenize(self, ids: Iterable[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    def __getstate__(self) -> dict:  # worker processes and deep copies reload from the file
        return {"path": str(self.path)}

    def __setstate__(self, state: dict) -> None:
        # the state is the path: this class's own __init__ loads the rest
        self.__init__(state["path"])  # type: ignore[misc]

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
