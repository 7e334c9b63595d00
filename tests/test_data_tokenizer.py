"""Tokenizer parity: the project's tokenizer (what `data prepare` writes) against the MLPerf
reference's tokenizer path, NeMo's `AutoTokenizer.text_to_ids` = transformers'
convert_tokens_to_ids(tokenize(text)), on the Hugging Face fast tokenizer built from the same
sentencepiece model by transformers' converter and on transformers' sentencepiece-backed slow
tokenizer. Models: the real 32,000-piece v1 model of the Mixtral family (package mistral-common,
loaded by the same `load_tokenizer` as production) and a small model trained on the tiny corpus.

Bare sentencepiece differs from the reference exactly where the text holds the string of a
special token (`<unk>`, `<s>`, `</s>`): transformers maps it to its id and encodes the text on
each side on its own. HARD_CASES lists those cases; everything else is identical.
"""
from __future__ import annotations

import pytest

from data_helpers import (hf_fast_tokenizer, hf_slow_tokenizer, make_tokenizer, mistral_v1_model,
                          reference_ids, texts)
from llama31_405b.data.tokenizer import load_tokenizer

MISTRAL = mistral_v1_model()
needs_mistral = pytest.mark.skipif(MISTRAL is None, reason="mistral-common (dev extra) is not "
                                   "installed: it ships the 32,000-piece tokenizer")

# (text, whether bare sentencepiece differs from the reference path)
HARD_CASES = [
    ("Hello world", False), (" leading space", False), ("trailing space ", False),
    ("multiple   spaces  inside", False), (" ", False), ("  ", False), ("   \t ", False),
    ("a\nb\n\nc", False), ("\n", False), ("\r\n", False), (" \n x", False),
    ("\ttab\there", False), ("emoji 😀🎉👍🏽", False), ("中文字符测试 日本語 한국어", False),
    ("byte fallback \x00\x01 ☃ 𝔘 \ufffd", False), ("\u00a0nbsp and \u2009thin", False),
    ("ﬁ ligature, café  naïve", False), ("▁underline ▁▁", False), ("<0x0A> <unk", False),
    ("<s", False), ("</s", False), ("< /s>", False), ("<S>", False), ("<<s >>", False),
    ("looks like </s> an eos", True), ("<s>bos</s>", True), ("</s>", True), ("x</s>y", True),
    ("<unk>", True), (" </s> ", True), ("a  </s>  b", True), ("end</s>", True),
    ("<s><s></s></s>", True), ("text <s>\n</s>\ttab", True),
]


def _models(tmp_path_factory):
    small = make_tokenizer(tmp_path_factory.mktemp("tok") / "small.model", texts(200))
    return [small] + ([MISTRAL] if MISTRAL is not None else [])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return _models(tmp_path_factory)


def test_hard_cases_match_the_reference_path(models):
    for model in models:
        tok = load_tokenizer(model)
        fast, slow = hf_fast_tokenizer(model), hf_slow_tokenizer(model)
        differs_from_bare = []
        for text, bare_differs in HARD_CASES:
            ours = tok.tokenize(text)
            assert ours == reference_ids(fast, text), (model.name, text)
            assert ours == reference_ids(slow, text), (model.name, text)
            assert ours == fast._tokenizer.encode(text, add_special_tokens=False).ids
            if tok.encode_plain(text) != ours:
                differs_from_bare.append(text)
        assert differs_from_bare == [t for t, d in HARD_CASES if d], model.name
        assert tok.tokenize_batch([t for t, _ in HARD_CASES]) == [tok.tokenize(t)
                                                                  for t, _ in HARD_CASES]


@needs_mistral
def test_real_32000_piece_tokenizer_by_production_code():
    tok = load_tokenizer(MISTRAL)
    assert (tok.vocab_size, tok.unk, tok.bos, tok.eod, tok.pad) == (32000, 0, 1, 2, -1)
    assert tok.special_pieces == {"<unk>": 0, "<s>": 1, "</s>": 2}
    assert tok.tokenize("x</s>y") == [tok.tokenize("x")[0], 2, tok.tokenize("y")[0]]


@needs_mistral
def test_corpus_sample_matches_with_32000_pieces():
    tok = load_tokenizer(MISTRAL)
    fast = hf_fast_tokenizer(MISTRAL)
    docs = texts(150)
    assert tok.tokenize_batch(docs) == [reference_ids(fast, d) for d in docs]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["small", "mistral"])
def test_whole_tiny_corpus_matches(which, tmp_path_factory):
    """Every document of the shipped tiny corpus (7,040), id for id (about 15 s per model)."""
    from llama31_405b.data.tiny import corpus_documents
    if which == "mistral" and MISTRAL is None:
        pytest.skip("mistral-common is not installed")
    model = MISTRAL if which == "mistral" else _models(tmp_path_factory)[0]
    tok = load_tokenizer(model)
    fast = hf_fast_tokenizer(model)
    docs = [d["text"] for d in corpus_documents()]
    ours = tok.tokenize_batch(docs)
    ref = [e.ids for e in fast._tokenizer.encode_batch(docs, add_special_tokens=False)]
    assert [i for i in range(len(docs)) if ours[i] != ref[i]] == []
    assert all(reference_ids(fast, docs[i]) == ours[i] for i in range(0, len(docs), 97))


def test_prepare_compares_with_the_folders_tokenizer_json(models, tmp_path, capsys):
    """MLCommons' tokenizer folder ships a tokenizer.json: prepare checks its own ids against it
    and stops before any work when they differ (here: transformers 5's own LlamaTokenizer, whose
    Metaspace pre-tokenizer drops the dummy prefix before a leading space)."""
    import shutil

    from transformers import LlamaTokenizer

    from data_helpers import write_shard
    from llama31_405b.data import DataError
    from llama31_405b.data.prepare import Output, prepare
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    model = shutil.copy(models[0], folder / "tokenizer.model")
    shard = write_shard(tmp_path / "c4.json.gz", texts(20))
    out = Output(prefix=tmp_path / "ds" / "x_text_document", inputs=(shard,))
    hf_fast_tokenizer(model).backend_tokenizer.save(str(folder / "tokenizer.json"))
    prepare([out], model, data_dir=tmp_path / "ds", workers=1, progress=True)
    assert "tokenizer: ids equal to tokenizer.json's on 29 texts" in capsys.readouterr().err
    LlamaTokenizer.from_pretrained(str(folder)).backend_tokenizer.save(
        str(folder / "tokenizer.json"))
    with pytest.raises(DataError, match=r"tokenizer\.json tokenize ' leading space' differently"):
        prepare([out], model, data_dir=tmp_path / "ds", workers=1, progress=False, force=True)
