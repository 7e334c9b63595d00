"""Small real fixtures for the data tests: documents of the shipped corpus, a small sentencepiece
model trained on them, C4-format shards (good and deliberately broken); the reference's tokenizer
path (transformers' tokenizers built from a sentencepiece model, NeMo's text_to_ids) and
reference-style indexed datasets; Mistral's 32,000-piece model from mistral-common; and
FileAccessWatch, which records the files a block of code opens or memory-maps."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from llama31_405b.data.tiny import corpus_documents
from llama31_405b.data.tokenizer import train_tokenizer

N_DOCS = 240


def texts(n: int = N_DOCS) -> list[str]:
    return [d["text"] for d in corpus_documents(limit=n)]


def make_tokenizer(path: Path, docs: list[str], vocab_size: int = 600) -> Path:
    return train_tokenizer(docs, path, vocab_size=vocab_size)


def write_shard(path: Path, docs: list[str], *, extra_lines: list[str] = (), at: int = 0,
                gz: bool = True) -> Path:
    """A C4-format shard; `extra_lines` (raw text) are inserted before document `at`."""
    lines = [json.dumps({"text": t, "timestamp": "2019-04-25T00:00:00Z", "url": f"u{i}"})
             for i, t in enumerate(docs)]
    lines[at:at] = list(extra_lines)
    data = ("\n".join(lines) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                    mtime=0) as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def truncate(path: Path, keep: float = 0.6) -> Path:
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])
    return path


class FileAccessWatch:
    """Records the files this process opens and memory-maps while active, through the audit
    events `open` (builtins.open, os.open, numpy.memmap's open) and `mmap.__new__` (its file
    descriptor resolved through /proc/self/fd). Audit hooks cannot be removed: one hook is
    installed per process and only records while a watch is active.

        with FileAccessWatch() as w:
            build_datasets(cfg, ...)
        assert not w.touched(".bin")
    """

    _active: list["FileAccessWatch"] = []
    _installed = False

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.mapped: list[str] = []

    @classmethod
    def _hook(cls, event: str, args: tuple) -> None:
        if not cls._active or event not in ("open", "mmap.__new__"):
            return
        import os
        if event == "open":
            path = args[0]
            if isinstance(path, int):
                return
            name = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
            for w in cls._active:
                w.opened.append(name)
        else:
            fd = args[0]
            try:
                name = os.readlink(f"/proc/self/fd/{fd}") if fd >= 0 else "<anonymous>"
            except OSError:
                name = f"<fd {fd}>"
            for w in cls._active:
                w.mapped.append(name)

    def __enter__(self) -> "FileAccessWatch":
        import sys
        if not FileAccessWatch._installed:
            sys.addaudithook(FileAccessWatch._hook)
            FileAccessWatch._installed = True
        FileAccessWatch._active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        FileAccessWatch._active.remove(self)

    def touched(self, suffix: str) -> list[str]:
        """Files ending with `suffix` that were opened or mapped."""
        return sorted({p for p in self.opened + self.mapped if p.endswith(suffix)})


# ------------------------------------------------------------------ the reference's tokenizer path
def mistral_v1_model() -> Path | None:
    """Mistral's v1 sentencepiece model (32,000 pieces, the Mixtral family) shipped by the
    `mistral-common` package (dev dependency), found without importing the package."""
    import importlib.util
    spec = importlib.util.find_spec("mistral_common")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "tokenizer.model.v1"
    return path if path.is_file() else None


def hf_fast_tokenizer(model: Path):
    """A Hugging Face fast tokenizer built from a sentencepiece model by transformers'
    `LlamaConverter` with legacy=True: BPE with byte fallback, merges ranked by piece score,
    normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, the special tokens <unk> <s>
    </s> (the layout of a Llama/Mistral-family `tokenizer.json`). transformers 5.24's
    SpmConverter.tokenizer passes the vocab scores where SentencePieceExtractor.extract now
    expects a model class, so the BPE model is built here from the converter's own vocab and
    transformers' `generate_merges`, as SentencePieceExtractor did before."""
    import types

    import sentencepiece as spm
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import LlamaConverter
    from transformers.tokenization_utils_base import generate_merges

    class Converter(LlamaConverter):
        def tokenizer(self, proto):
            scores = self.vocab(proto)
            vocab = {piece: i for i, (piece, _) in enumerate(scores)}
            return Tokenizer(models.BPE(vocab, generate_merges(vocab, scores),
                                        unk_token=proto.trainer_spec.unk_piece, fuse_unk=True,
                                        byte_fallback=True, dropout=None))

    sp = spm.SentencePieceProcessor(model_file=str(model))
    original = types.SimpleNamespace(vocab_file=str(model), legacy=True, add_prefix_space=True,
                                     convert_ids_to_tokens=sp.id_to_piece)
    return PreTrainedTokenizerFast(tokenizer_object=Converter(original).converted(),
                                   unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def hf_slow_tokenizer(model: Path):
    """transformers' sentencepiece-backed tokenizer (the slow path, legacy=True)."""
    from transformers.tokenization_utils_sentencepiece import SentencePieceBackend
    return SentencePieceBackend(vocab_file=str(model), legacy=True, unk_token="<unk>",
                                bos_token="<s>", eos_token="</s>")


def reference_ids(hf, text: str) -> list[int]:
    """What NeMo's `AutoTokenizer.text_to_ids` does (nemo-toolkit 2.1.0 and 3.0.0):
    convert_tokens_to_ids(tokenize(text)), no special tokens added."""
    return hf.convert_tokens_to_ids(hf.tokenize(text))


def write_reference_dataset(prefix: Path, docs: list[list[int]], vocab_size: int) -> Path:
    """An indexed dataset written the way the reference's preprocessing does: one sequence per
    document, no EOD, uint16 ids (megatron-core's builder writes the same format as NeMo's)."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    dtype = np.uint16 if vocab_size <= 65536 else np.int32
    prefix.parent.mkdir(parents=True, exist_ok=True)
    b = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for ids in docs:
        if ids:
            b.add_document(np.array(ids, dtype=dtype), [len(ids)])
    b.finalize(f"{prefix}.idx")
    return prefix
