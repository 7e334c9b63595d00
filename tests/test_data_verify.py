"""verify_data (manifest, MLCommons-style accepted files, tampering, tokenizer checks) and
build_datasets (blended GPTDataset, exact packed validation, determinism, several gloo ranks)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from data_helpers import make_tokenizer, texts, write_shard
from llama31_405b.cli import main as cli_main
from llama31_405b.config import load_config
from llama31_405b.data import DataError
from llama31_405b.data.datasets import build_datasets
from llama31_405b.data.indexed import read_index, token_stream
from llama31_405b.data.manifest import load_manifest, manifest_path
from llama31_405b.data.prepare import Output, prepare
from llama31_405b.data.verify import verify_data

REPO = Path(__file__).resolve().parents[1]
SEQ = 32


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A small data_dir in the tiny config's layout, prepared by `prepare`."""
    root = tmp_path_factory.mktemp("verify") / "data"
    docs = texts()
    make_tokenizer(root / "tokenizer" / "tok.model", docs[:200])
    names = {"c4-train.en_6_text_document": docs[0:100], "c4-train.en_7_text_document": docs[100:200],
             "c4-validation.en_text_document": docs[200:240]}
    outs = [Output(prefix=root / name, inputs=(write_shard(root / "raw" / f"{name}.json.gz", d),))
            for name, d in names.items()]
    prepare(outs, root / "tokenizer" / "tok.model", data_dir=root, workers=2, progress=False)
    return root


def _cfg(data_dir: Path, **data):
    cfg = load_config(REPO / "configs" / "tiny_cpu.toml")
    cfg.model.seq_length = SEQ
    cfg.data.data_dir = str(data_dir)
    cfg.data.tokenizer = "tokenizer/tok.model"
    cfg.data.pretrain_prefix = None
    for k, v in data.items():
        setattr(cfg.data, k, v)
    return cfg


@pytest.fixture
def copy(prepared, tmp_path):
    """A private copy of the prepared data_dir (tests below damage it)."""
    dst = tmp_path / "data"
    shutil.copytree(prepared, dst, ignore=shutil.ignore_patterns("index_cache"))
    return dst


def test_prepared_data_verifies(prepared):
    logs = []
    verify_data(_cfg(prepared), full=True, log=logs.append)
    assert sum(line.startswith("ok ") for line in logs) == 3


def test_unverified_until_recorded_then_tamper_detected(copy, capsys, monkeypatch):
    # files without a manifest record (like MLCommons' ready-made ones) are refused
    manifest_path(copy).unlink()
    cfg = _cfg(copy)
    with pytest.raises(DataError, match="not verified against .*manifest.json.*--write-manifest"):
        verify_data(cfg)
    cfg.data.require_verified = False
    verify_data(cfg)  # warning only
    cfg.data.require_verified = True
    verify_data(cfg, write_manifest=True)
    assert load_manifest(copy)["datasets"]["c4-train.en_6_text_document"]["origin"] == "accepted"
    verify_data(cfg, full=True)
    # flip one token in the middle of en_7: structure still fine, checksum is not
    bin_ = copy / "c4-train.en_7_text_document.bin"
    raw = bytearray(bin_.read_bytes())
    raw[len(raw) // 2] ^= 1
    bin_.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"en_7_text_document\.bin: sampled checksum mismatch"):
        verify_data(cfg)
    monkeypatch.chdir(copy.parent)  # the tiny config's relative data_dir is not there
    assert cli_main(["data", "verify", str(REPO / "configs/tiny_cpu.toml")]) == 1
    assert "error:" in capsys.readouterr().err


def test_structural_damage_and_missing(copy):
    cfg = _cfg(copy)
    idx = copy / "c4-train.en_6_text_document.idx"
    idx.write_bytes(idx.read_bytes()[:-8])
    with pytest.raises(DataError, match=r"en_6_text_document\.idx: .*truncated or damaged"):
        verify_data(cfg)
    idx.unlink()
    with pytest.raises(DataError, match=r"en_6_text_document\.idx: missing"):
        verify_data(cfg)
    with pytest.raises(DataError, match="data_dir .*folder not found"):
        verify_data(_cfg(copy / "nowhere"))


def test_tokenizer_checks(copy):
    cfg = _cfg(copy)
    cfg.model.vocab_size = 512  # the tokenizer has 600 pieces
    with pytest.raises(DataError, match=r"tok\.model: tokenizer vocab 600 is larger than "
                                        r"model\.vocab_size 512"):
        verify_data(cfg)
    other = make_tokenizer(copy / "tokenizer" / "other.model", texts(60), vocab_size=400)
    with pytest.raises(DataError, match="prepared with a different tokenizer|token id"):
        verify_data(_cfg(copy, tokenizer=str(other.relative_to(copy))))


def test_validation_too_small(copy):
    cfg = _cfg(copy)
    cfg.model.seq_length = 4096  # 64 x 4096 tokens: far more than 40 documents
    with pytest.raises(DataError, match=r"c4-validation\.en_text_document\.bin: \d+ tokens, but "
                                        r"64 validation sequences of 4096 need 262145"):
        verify_data(cfg)


def test_build_datasets(prepared):
    cfg = _cfg(prepared)
    train, valid = build_datasets(cfg, seed=7, train_samples=300)
    assert len(train) >= 300 and len(valid) == cfg.derived.eval_samples == 64
    item = train[5]
    for k in ("tokens", "labels", "loss_mask", "position_ids"):
        assert item[k].shape == (SEQ,)
    assert torch.equal(item["labels"][:-1], item["tokens"][1:])
    stream = np.asarray(token_stream(read_index(prepared / "c4-validation.en_text_document")))
    for i in (0, 1, 63):  # exact, unshuffled packing of the validation documents
        v = valid[i]
        assert v["tokens"].tolist() == stream[i * SEQ:(i + 1) * SEQ].tolist()
        assert v["labels"].tolist() == stream[i * SEQ + 1:(i + 1) * SEQ + 1].tolist()
        assert v["loss_mask"].sum() == SEQ and v["position_ids"].tolist() == list(range(SEQ))
    with pytest.raises(IndexError):
        valid[64]
    again, _ = build_datasets(cfg, seed=7, train_samples=300)
    other, _ = build_datasets(cfg, seed=8, train_samples=300)
    same = all(torch.equal(train[i]["tokens"], again[i]["tokens"]) for i in range(20))
    differ = any(not torch.equal(train[i]["tokens"], other[i]["tokens"]) for i in range(20))
    assert same and differ
    assert any(p.name.endswith("shuffle_index.npy") for p in (prepared / "index_cache").iterdir())


def _rank_main(rank: int, world: int, data_dir: str, port: int, out: str) -> None:
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    train, valid = build_datasets(_cfg(Path(data_dir)), seed=11, train_samples=200)
    sums = [int(train[i]["tokens"].sum()) for i in range(0, 200, 17)]
    Path(out, f"r{rank}.json").write_text(json.dumps([len(train), len(valid), sums]))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_build_datasets_on_several_gloo_ranks(copy, tmp_path):
    import socket

    import torch.multiprocessing as tmp_mp
    shutil.rmtree(copy / "index_cache", ignore_errors=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # fork: the ranks inherit the imports (spawn would pay torch + megatron twice more)
    tmp_mp.start_processes(_rank_main, args=(2, str(copy), port, str(tmp_path)), nprocs=2,
                           join=True, start_method="fork")
    r0, r1 = (json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1))
    assert r0 == r1 and r0[1] == 64
