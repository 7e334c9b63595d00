"""At `data prepare` time: the project's tokenizer against the Hugging Face `tokenizer.json` that
sits beside the sentencepiece model, when there is one (MLCommons' tokenizer folder ships it; the
reference tokenized through a transformers tokenizer of that folder, see tokenizer.py).

The tests prove the project's ids equal transformers' on the models available offline; this
check extends that to the real file of the folder being used: the first documents of the input
and a few hard strings (spaces, newlines, special-token text) must give identical ids, computed
as NeMo's wrapper does (tokens of the fast tokenizer, then each token's id), or prepare stops
before any work. Without a `tokenizer.json`, or without the `tokenizers` package, it says so and
prepares anyway.
"""
from __future__ import annotations

from pathlib import Path

from .errors import DataError
from .reader import ShardReader

SAMPLE_DOCS = 256
HARD_STRINGS = (" leading space", "trailing space ", "multiple   spaces", "a\nb\n\n\tc",
                "emoji 😀 and 中文", "bytes \x00\x01", "text with </s> and <s> inside",
                "</s>", "x<unk>y")


def reference_ids(hf, text: str) -> list[int]:
    """NeMo's `text_to_ids` on a `tokenizers.Tokenizer`: its tokens, then each token's id."""
    return [hf.token_to_id(t) for t in hf.encode(text, add_special_tokens=False).tokens]


def sample_texts(shard: Path, n: int = SAMPLE_DOCS, *, skip_bad: bool = False) -> list[str]:
    """The first n texts of `shard` (fewer when it ends or breaks: the unit that reads it
    reports that)."""
    out: list[str] = []
    try:
        for text in ShardReader(shard, skip_bad=skip_bad):
            out.append(text)
            if len(out) >= n:
                break
    except DataError:
        pass
    return out


def check_tokenizer_json(tok, texts: list[str]) -> str:
    """Raise DataError when the ids differ; return a line saying what was compared."""
    path = Path(tok.path).parent / "tokenizer.json"
    if not path.is_file():
        return f"no {path.name} beside {Path(tok.path).name}: ids not compared with it"
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return f"package `tokenizers` not installed: ids not compared with {path}"
    try:
        hf = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - any parse failure of the user's file
        raise DataError(f"{path}: not a Hugging Face tokenizer file ({e}); remove it or use "
                        "the tokenizer folder as MLCommons ships it") from None
    sample = list(HARD_STRINGS) + list(texts)
    for text, ids in zip(sample, tok.tokenize_batch(sample)):
        ref = reference_ids(hf, text)
        if ref != ids:
            k = next((i for i, (a, b) in enumerate(zip(ref, ids)) if a != b), min(len(ref),
                                                                                len(ids)))
            raise DataError(f"{tok.path} and {path} tokenize {text[:60]!r} differently (ids "
                            f"from position {k}: {ids[k:k + 6]} vs {ref[k:k + 6]}); data prepare "
                            "would not reproduce the reference's token stream with this folder: "
                            "use MLCommons' prepared files, or check that both files come from "
                            "the same tokenizer")
    return f"ids equal to {path.name}'s on {len(sample)} texts"
