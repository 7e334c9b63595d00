"""The tiny corpus: deterministic split of the shipped text, and ensure_tiny_data end to end
(names configs/tiny_cpu.toml expects, sizes, tokenizer vocab, the reference's token stream
without EOD, verification recorded so train accepts it at once, second call is a no-op)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from llama31_405b.config import load_config
from llama31_405b.data.indexed import read_index
from llama31_405b.data.tiny import (MIN_VALID_TOKENS, RAW, TOKENIZER, corpus_documents,
                                    ensure_tiny_data, split_corpus)
from llama31_405b.data.tokenizer import load_tokenizer
from llama31_405b.data.verify import require_verified, verify_data

REPO = Path(__file__).resolve().parents[1]


def test_corpus_is_english_documents_with_sources():
    docs = corpus_documents(limit=50)
    assert len(docs) == 50
    assert {d["source"] for d in docs} <= {"python-docs", "postgresql-docs", "sqlite-docs"}
    assert all(len(d["text"].split()) >= 12 for d in docs)


def test_split_is_deterministic_and_complete():
    docs = corpus_documents(limit=400)
    a, b = split_corpus(docs), split_corpus(list(reversed(docs)))
    assert a == b  # independent of input order
    assert sum(len(v) for v in a.values()) == 400
    assert all(a[name] for name in RAW)
    seen = [d["text"] for v in a.values() for d in v]
    assert len(set(seen)) == len(seen)


@pytest.mark.slow
def test_ensure_tiny_data(tmp_path):
    d = ensure_tiny_data(tmp_path / "tiny", quiet=True)
    cfg = load_config(REPO / "configs" / "tiny_cpu.toml")
    cfg.data.data_dir = str(d)
    assert cfg.data.tokenizer == TOKENIZER and set(RAW.values()) == {
        *cfg.data.train_prefixes, cfg.data.valid_prefix, cfg.data.pretrain_prefix}
    tok = load_tokenizer(d / TOKENIZER)
    assert 2000 <= tok.vocab_size <= cfg.model.vocab_size == 4096
    tokens = {name: read_index(d / name).tokens for name in RAW.values()}
    assert tokens["c4-train.en_6_text_document"] >= 1_450_000
    assert tokens["c4-train.en_7_text_document"] >= 1_450_000
    assert tokens["c4-pretrain.en_text_document"] >= 1_000_000
    assert tokens["c4-validation.en_text_document"] >= 3 * MIN_VALID_TOKENS
    with gzip.open(d / next(iter(RAW))) as f:  # C4 json.gz format
        assert set(json.loads(f.readline())) == {"text", "timestamp", "url"}
    assert require_verified(cfg)["eod"] == "none"  # recorded by ensure_tiny_data itself
    # token for token what the reference's path (transformers' tokenizer, no EOD) writes
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from data_helpers import hf_fast_tokenizer, reference_ids
    hf = hf_fast_tokenizer(d / TOKENIZER)
    with gzip.open(d / "raw/c4-validation.00000-of-00001.json.gz", "rt") as f:
        texts = [json.loads(line)["text"] for line in f]
    ds = IndexedDataset(str(d / "c4-validation.en_text_document"))
    assert [ds[i].tolist() for i in range(len(ds))] == [reference_ids(hf, t) for t in texts]
    verify_data(cfg, full=True)
    stamp = (d / "tiny_data.json").stat().st_mtime_ns
    bin_ = (d / "c4-train.en_6_text_document.bin").stat().st_mtime_ns
    ensure_tiny_data(d, quiet=True)
    assert (d / "tiny_data.json").stat().st_mtime_ns == stamp
    assert (d / "c4-train.en_6_text_document.bin").stat().st_mtime_ns == bin_
