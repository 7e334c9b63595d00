"""verify_data (manifest, MLCommons-style accepted files, tampering, tokenizer checks, EOD
conventions), require_verified (manifest only, no .bin touched), and build_datasets (blended
GPTDataset, exact packed validation, determinism, no .bin opened before the first sample read,
several gloo ranks)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from data_helpers import (FileAccessWatch, hf_fast_tokenizer, make_tokenizer, reference_ids,
                          texts, write_reference_dataset, write_shard)
from helpers import zygote
from llama31_405b.cli import main as cli_main
from llama31_405b.config import load_config
from llama31_405b.data import DataError
from llama31_405b.data.datasets import build_datasets
from llama31_405b.data.indexed import read_index, token_stream
from llama31_405b.data.manifest import load_manifest, manifest_path
from llama31_405b.data.prepare import Output, prepare
from llama31_405b.data.tokenizer import load_tokenizer
from llama31_405b.data.layout import MLCOMMONS_VALID_PREFIX
from llama31_405b.data.verify import require_verified, verify_data

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


def test_prepared_data_verifies(copy):
    logs = []
    verify_data(_cfg(copy), full=True, log=logs.append)
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


def _rank_main(rank: int, data_dir: str, out: str) -> None:
    import torch.distributed as dist
    dist.init_process_group("gloo")           # RANK, WORLD_SIZE, MASTER_* from the launcher
    train, valid = build_datasets(_cfg(Path(data_dir)), seed=11, train_samples=200)
    sums = [int(train[i]["tokens"].sum()) for i in range(0, 200, 17)]
    Path(out, f"r{rank}.json").write_text(json.dumps([len(train), len(valid), sums]))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_build_datasets_on_several_gloo_ranks(copy, tmp_path):
    shutil.rmtree(copy / "index_cache", ignore_errors=True)
    # forks of the preloaded zygote, not of this process (which may hold OpenMP threads from
    # earlier tests: a fork of it could hang), killed at the timeout instead of waited on forever
    zygote.spawn(_rank_main, (str(copy), str(tmp_path)), 2, timeout=300, check=True)
    r0, r1 = (json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1))
    assert r0 == r1 and r0[1] == 64


def test_require_verified_reads_the_manifest_only(copy):
    cfg = _cfg(copy)
    with pytest.raises(DataError, match=r"no passing verification recorded.*python -m "
                                        r"llama31_405b data verify"):
        require_verified(cfg)  # prepared, never verified
    verify_data(cfg)
    with FileAccessWatch() as w:
        res = require_verified(cfg)
    assert w.touched(".idx") and not w.touched(".bin"), w.touched(".bin")
    assert res["eod"] == "none"
    rec = res["datasets"]["c4-train.en_6_text_document"]
    bin_ = copy / "c4-train.en_6_text_document.bin"
    assert rec["passed"] and rec["time"].endswith("Z") and "ids_below_vocab" in rec["checks"]
    assert rec["files"][".bin"]["size"] == bin_.stat().st_size and rec["max_id"] < 600
    st = bin_.stat()  # rewritten after the verification: same size, another mtime
    os.utime(bin_, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(DataError, match=r"en_6_text_document\.bin: size or mtime changed since "
                                        r"the verification.*data verify"):
        require_verified(cfg)
    verify_data(cfg)  # verifying again accepts the file as it is now
    require_verified(cfg)


def test_build_datasets_touches_no_bin_before_the_first_read(prepared):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from llama31_405b.data.datasets import indexed_datasets
    cfg = _cfg(prepared)
    with FileAccessWatch() as w:
        train, valid = build_datasets(cfg, seed=3, train_samples=40)
    assert w.touched(".idx") and not w.touched(".bin"), w.touched(".bin")
    with FileAccessWatch() as w:
        item, v = train[0], valid[1]
    assert {Path(p).name for p in w.touched(".bin")} >= {"c4-validation.en_text_document.bin"}
    stream = np.asarray(token_stream(read_index(prepared / "c4-validation.en_text_document")))
    assert v["tokens"].tolist() == stream[SEQ:2 * SEQ].tolist()
    assert item["tokens"].shape == (SEQ,)
    for ix in indexed_datasets(train):  # the lazy reader returns what megatron's mmap reader does
        eager = IndexedDataset(ix.path_prefix, mmap=True)
        assert all(np.array_equal(ix.get(i), eager.get(i)) for i in (0, 1, len(ix) - 1))


def test_eod_convention_is_found_and_must_agree(copy):
    cfg = _cfg(copy)
    assert verify_data(cfg)["eod"] == "none"
    tok = copy / "tokenizer" / "tok.model"
    names = ["c4-train.en_6_text_document", "c4-train.en_7_text_document",
             "c4-validation.en_text_document"]
    outs = {n: Output(prefix=copy / n, inputs=(copy / "raw" / f"{n}.json.gz",)) for n in names}
    prepare([outs[names[2]]], tok, data_dir=copy, workers=1, progress=False, append_eod=True)
    with pytest.raises(DataError, match=r"disagree on end-of-document tokens \(c4-train\.en_6"
                                        r"_text_document: none, .*c4-validation.*: appended"):
        verify_data(cfg)
    prepare([outs[n] for n in names[:2]], tok, data_dir=copy, workers=1, progress=False,
            append_eod=True)
    assert verify_data(cfg)["eod"] == "appended"
    assert require_verified(cfg)["eod"] == "appended"
    m = load_manifest(copy)["datasets"]["c4-train.en_7_text_document"]
    assert m["append_eod"] is True and m["verified"]["eod"] == "appended"


def _mlcommons_layout(root: Path, model: Path, docs: list[str]) -> Path:
    """Files as MLCommons publishes them, written the way the reference prepares them: the
    Hugging Face fast tokenizer's tokenize + convert_tokens_to_ids, no BOS, no EOD; the
    validation pair in a folder of its name with the inner files misspelt; the unused
    c4-validation-small and c4-validation files beside them."""
    hf = hf_fast_tokenizer(model)
    (root / "tokenizer").mkdir(parents=True)
    shutil.copy(model, root / "tokenizer" / "tokenizer.model")
    parts = {"c4-train.en_6_text_document": docs[0:100], "c4-train.en_7_text_document":
             docs[100:200], f"{MLCOMMONS_VALID_PREFIX}/c4-validationn-91205-samples.en_text_"
             "document": docs[200:240], "c4-validation-small.en_text_document": docs[200:205],
             "c4-validation.en_text_document": docs[200:220]}
    for name, part in parts.items():
        write_reference_dataset(root / name, [reference_ids(hf, t) for t in part], 600)
    cfg = root.parent / "mlcommons.toml"
    cfg.write_text(f'base = "{REPO / "configs" / "tiny_cpu.toml"}"\n\n[data]\n'
                   f'tokenizer = "tokenizer/tokenizer.model"\n'
                   f'valid_prefix = "{MLCOMMONS_VALID_PREFIX}"\npretrain_prefix = ""\n')
    return cfg


def test_mlcommons_files_as_published_are_accepted_and_read(prepared, tmp_path, capsys):
    root = tmp_path / "mlcommons"
    docs = texts()
    cfg_file = _mlcommons_layout(root, prepared / "tokenizer" / "tok.model", docs)
    args = ["data", "verify", str(cfg_file), "--set", f'data.data_dir="{root}"']
    assert cli_main(args) == 1  # not recorded yet
    assert "--write-manifest" in capsys.readouterr().err
    assert cli_main(args + ["--write-manifest"]) == 0
    out = capsys.readouterr()
    assert "documents end with EOD: no" in out.out and "EOD none" in out.err
    m = load_manifest(root)["datasets"]
    key = f"{MLCOMMONS_VALID_PREFIX}/c4-validationn-91205-samples.en_text_document"
    assert set(m) == {"c4-train.en_6_text_document", "c4-train.en_7_text_document", key}
    assert m[key]["origin"] == "accepted" and m[key]["append_eod"] is False
    assert m[key]["verified"]["eod"] == "none" and m[key]["documents"] == 40
    assert cli_main(args) == 0  # recorded: verifies again without --write-manifest
    from llama31_405b.cli.options import load_with_sets
    cfg = load_with_sets(str(cfg_file), [f'data.data_dir="{root}"'])
    assert require_verified(cfg)["eod"] == "none"
    train, valid = build_datasets(cfg, seed=5, train_samples=16)
    tok = load_tokenizer(root / "tokenizer" / "tokenizer.model")
    stream = [i for t in docs[200:240] for i in tok.tokenize(t)]
    assert valid[0]["tokens"].tolist() == stream[:256] and len(train) >= 16
    # `data prepare` on the same text writes the same tokens as the reference-style files
    prefix = tmp_path / "ours" / "c4-train.en_6_text_document"
    shard = write_shard(tmp_path / "raw" / "en_6.json.gz", docs[0:100])
    prepare([Output(prefix=prefix, inputs=(shard,))], root / "tokenizer" / "tokenizer.model",
            data_dir=prefix.parent, workers=1, progress=False)
    for ext in (".bin", ".idx"):
        assert Path(f"{prefix}{ext}").read_bytes() == (root / f"{prefix.name}{ext}").read_bytes()


def test_validation_file_of_the_benchmark_must_hold_91205_documents(copy):
    cfg = load_config(REPO / "configs" / "config_GB200_2048x4x8xtp4pp8cp2.toml")
    cfg.data.data_dir, cfg.data.tokenizer = str(copy), "tokenizer/tok.model"
    for ext in (".bin", ".idx"):
        shutil.copy(copy / f"c4-validation.en_text_document{ext}",
                    copy / f"{MLCOMMONS_VALID_PREFIX}{ext}")
    for check in (verify_data, require_verified):
        with pytest.raises(DataError, match=r"91205-samples\.en_text_document\.idx: 40 documents, "
                                            r"MLCommons' validation file has 91205"):
            check(cfg)


def test_layout_errors_name_the_fix(tmp_path):
    from llama31_405b.data.layout import resolve_prefix
    (tmp_path / "x_text_document.bin").mkdir()
    (tmp_path / "x_text_document.bin" / "inner.bin").touch()
    with pytest.raises(DataError, match=r"x_text_document\.bin: a folder, where a file was "
                                        r"expected.*inner\.bin.*side by side"):
        resolve_prefix(tmp_path / "x_text_document")
    d = tmp_path / "y_text_document"
    d.mkdir()
    for stem in ("a", "b"):
        for ext in (".bin", ".idx"):
            (d / f"{stem}{ext}").touch()
    with pytest.raises(DataError, match=r"y_text_document: a folder.*holds a, b"):
        resolve_prefix(d)
    assert resolve_prefix(tmp_path / "missing") == tmp_path / "missing"


def test_verify_cli_exit_codes(prepared, tmp_path, capsys):
    assert cli_main(["data", "verify", str(tmp_path / "none.toml")]) == 2
    assert cli_main(["data", "verify", str(REPO / "configs" / "tiny_cpu.toml"),
                     "--set", "data.no_such_key=1"]) == 2
    assert "no_such_key" in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_training_run_reads_mlcommons_style_reference_files(tiny_env, tmp_path):
    """The tiny corpus written the reference's way (transformers' tokenizer, no EOD) in the
    layout of MLCommons' download, recorded by `data verify --write-manifest`, then read by a
    real tiny training run (open division: 2 steps and an evaluation after the second, the
    training and validation files both read; a few seconds after startup)."""
    import gzip

    from conftest import run_train
    src = tiny_env["data_dir"]
    root = tmp_path / "mlcommons"
    hf = hf_fast_tokenizer(src / "tokenizer" / "tiny_sp.model")
    (root / "tokenizer").mkdir(parents=True)
    shutil.copy(src / "tokenizer" / "tiny_sp.model", root / "tokenizer" / "tokenizer.model")
    raw = {"c4-train.en_6_text_document": "c4-train.00000-of-00002.json.gz",
           "c4-train.en_7_text_document": "c4-train.00001-of-00002.json.gz",
           f"{MLCOMMONS_VALID_PREFIX}/c4-validationn-91205-samples.en_text_document":
               "c4-validation.00000-of-00001.json.gz"}
    for name, shard in raw.items():
        with gzip.open(src / "raw" / shard, "rt") as f:
            docs = [json.loads(line)["text"] for line in f]
        write_reference_dataset(root / name, [reference_ids(hf, t) for t in docs], 4000)
    cfg = tmp_path / "mlcommons.toml"
    cfg.write_text(f'base = "{tiny_env["config"]}"\n\n[data]\ndata_dir = "{root}"\n'
                   f'tokenizer = "tokenizer/tokenizer.model"\n'
                   f'valid_prefix = "{MLCOMMONS_VALID_PREFIX}"\npretrain_prefix = ""\n')
    assert cli_main(["data", "verify", str(cfg), "--write-manifest"]) == 0
    log = tmp_path / "result.txt"
    sets = ("run.max_steps=2", 'run.division="open"', "eval.first_step=2",
            "eval.interval_steps=2")
    r = run_train(cfg, 1, log, extra_args=tuple(a for s in sets for a in ("--set", s)))
    text = log.read_text()
    assert '"key": "run_start"' in text and '"key": "eval_accuracy"' in text, r.stderr[-3000:]
    assert "DataError" not in r.stderr and '"step": 2' in text


_READ_ONLY_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from test_data_verify import _cfg
from llama31_405b.data import DataError
from llama31_405b.data.datasets import build_datasets
from llama31_405b.data.verify import require_verified, verify_data
from pathlib import Path
data, rw = Path({data!r}), Path({rw!r})
out = {{}}
try:
    verify_data(_cfg(data))
except DataError as e:
    out["default"] = str(e)
logs = []
cfg = _cfg(data, manifest=str(rw / "manifest.json"), index_cache_dir=str(rw / "index_cache"))
verify_data(cfg, log=logs.append)
out["ok"] = sum(line.startswith("ok ") for line in logs)
out["eod"] = require_verified(cfg)["eod"]
train, valid = build_datasets(cfg, seed=3, train_samples=16)
out["samples"] = len(train)
logs = []
verify_data(_cfg(data, manifest=str(rw / "manifest.json")), log=logs.append)
out["cache_warning"] = [m for m in logs if m.startswith("warning")]
print("RESULT " + json.dumps(out))
"""


def test_read_only_data_dir_with_the_manifest_and_index_cache_elsewhere(copy, tmp_path):
    """Data on a read-only mount (a bind mount remounted read-only in a private mount namespace,
    so even root cannot write): data verify refuses the default manifest location before
    reading any .bin, naming data.manifest; with data.manifest and data.index_cache_dir pointing
    at a writable folder (the manifest copied there), it verifies, train's check passes and the
    datasets build; data_dir is left as it was."""
    import subprocess
    import sys
    rw = tmp_path / "rw"
    rw.mkdir()
    m = load_manifest(copy)
    for ds in m["datasets"].values():
        ds.pop("verified", None)
    (rw / "manifest.json").write_text(json.dumps(m))
    before = sorted(str(p.relative_to(copy)) for p in copy.rglob("*"))
    script = tmp_path / "ro.py"
    script.write_text(_READ_ONLY_SCRIPT.format(tests=str(REPO / "tests"), data=str(copy),
                                               rw=str(rw)))
    cmd = (f"mount --make-rprivate / && mount --bind {copy} {copy} && "
           f"mount -o remount,bind,ro {copy} {copy} && ! touch {copy}/probe 2>/dev/null && "
           f"exec {sys.executable} {script}")
    r = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("RESULT ", 1)[1])
    assert "manifest.json: not writable" in out["default"] and "data.manifest" in out["default"]
    assert out["ok"] == 3 and out["eod"] == "none" and out["samples"] >= 16
    assert "data.index_cache_dir" in out["cache_warning"][0]
    assert "verified" in load_manifest(copy, rw / "manifest.json")["datasets"][
        "c4-train.en_6_text_document"]
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*")) == before
