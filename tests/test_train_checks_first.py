"""Cheap checks first (issue 36, part 7): `train` checks the data (manifest, tokenizer, files and
their sizes) and the initial checkpoint's record before it builds the model or reads a tensor;
messages name the config key as well as the path; the `data verify` command they suggest carries
the user's --set overrides; and a suggested fix fixes (a file changed since the manifest: the
suggested `data verify --write-manifest` records it, where it used to return the same error)."""
from __future__ import annotations

import json
import shlex
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from checkpoint_helpers import empty_dcp_index
from helpers import zygote
from llama31_405b.checkpoint.format import MODEL_INFO, SHAPE_KEYS, CheckpointError
from llama31_405b.cli import main as cli_main
from llama31_405b.data import DataError
from llama31_405b.data.indexed import read_index
from llama31_405b.data.verify import require_verified, verify_command, verify_data
from llama31_405b.train.inputs import check_inputs
from test_data_verify import _cfg, prepared  # noqa: F401  (the module's data fixture)

REPO = Path(__file__).resolve().parents[1]
EN6 = "c4-train.en_6_text_document"


@pytest.fixture
def data(prepared, tmp_path):  # noqa: F811
    dst = tmp_path / "data"
    shutil.copytree(prepared, dst, ignore=shutil.ignore_patterns("index_cache"))
    return dst


def _config_file(tmp_path: Path) -> Path:
    """A config file whose data_dir does not exist: the user's --set gives the real one."""
    path = tmp_path / "run.toml"
    path.write_text(f'base = "{REPO / "configs" / "tiny_cpu.toml"}"\n\n[model]\nseq_length = 32\n'
                    '\n[data]\ndata_dir = "/nonexistent/data"\ntokenizer = "tokenizer/tok.model"\n'
                    'pretrain_prefix = ""\n\n[run]\ndivision = "open"\n')
    return path


def _checkpoint(path: Path, cfg, **changes) -> Path:
    """A checkpoint folder whose record (MODEL_INFO) is cfg's model with `changes`; its tensor
    files are empty stand-ins: nothing here may read them."""
    path.mkdir(parents=True)
    (path / "metadata.json").write_text("{}")
    (path / ".metadata").write_bytes(empty_dcp_index())
    info = {k: getattr(cfg.model, k) for k in SHAPE_KEYS} | changes
    (path / MODEL_INFO).write_text(json.dumps(info))
    return path


def test_missing_tokenizer_and_data_dir_name_the_key_and_the_path(data):
    cfg = _cfg(data, tokenizer="tokenizer/missing.model")
    with pytest.raises(DataError, match=rf"^data\.tokenizer = {data}/tokenizer/missing\.model: "
                       "not found"):
        check_inputs(cfg, init_checkpoint="")
    (data / "tokenizer" / "broken.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match=rf"^data\.tokenizer = {data}/tokenizer/broken\.model: "
                       "not a sentencepiece model"):
        check_inputs(_cfg(data, tokenizer="tokenizer/broken.model"), init_checkpoint="")
    cfg = _cfg(data.parent / "absent")
    with pytest.raises(DataError, match=rf"^data\.data_dir = {data.parent}/absent: folder not "
                       "found"):
        check_inputs(cfg, init_checkpoint="")
    (data / f"{EN6}.idx").unlink()
    with pytest.raises(DataError, match=rf"^data\.train_prefixes\[0\] = {EN6}: {data}/{EN6}"
                       r"\.idx: missing"):
        check_inputs(_cfg(data, require_verified=False), init_checkpoint="")


def test_checkpoint_record_is_checked_by_key_without_a_tensor(data):
    cfg = _cfg(data, require_verified=False)
    good = _checkpoint(data.parent / "ck", cfg)
    assert check_inputs(cfg, init_checkpoint=str(good)).checkpoint == str(good)
    other = _checkpoint(data.parent / "other", cfg, hidden_size=2 * cfg.model.hidden_size)
    with pytest.raises(CheckpointError, match=rf"^--init-checkpoint = {other}: checkpoint does "
                       r"not match the model .*hidden_size"):
        check_inputs(cfg, init_checkpoint=str(other))
    (good / MODEL_INFO).write_text("{not json")
    cfg.checkpoint.ckpt_dir, cfg.checkpoint.init = str(good.parent), good.name
    with pytest.raises(CheckpointError, match=rf"^checkpoint\.ckpt_dir/checkpoint\.init = {good}: "
                       f"{MODEL_INFO} cannot be read"):
        check_inputs(cfg, init_checkpoint=None)


def test_suggested_data_verify_carries_the_users_set_overrides(data, tmp_path, capsys):
    config = _config_file(tmp_path)
    sets = [f"data.data_dir={data}", "data.require_verified=true"]
    from llama31_405b.config import load_config
    from llama31_405b.config.overrides import parse_sets
    cfg = load_config(config, overrides=parse_sets(sets))
    want = f"python -m llama31_405b data verify {config} --set data.data_dir={data} --set " \
           "data.require_verified=true"
    assert verify_command(cfg, sets) == want
    with pytest.raises(DataError, match=r"no passing verification recorded.*run `"
                       + rf"{want}` first".replace(".", r"\.")):
        require_verified(cfg, sets)
    assert cli_main(shlex.split(want)[3:]) == 0      # the suggested command runs as shown
    require_verified(cfg, sets)
    # files without a manifest entry: data verify suggests --write-manifest, with the --set too
    (data / "manifest.json").unlink()
    capsys.readouterr()
    assert cli_main(["data", "verify", str(config), *(a for s in sets for a in ("--set", s))]) == 1
    err = capsys.readouterr().err
    suggested = err.split("run `", 1)[1].split("`", 1)[0]
    assert suggested == f"{want} --write-manifest", err
    assert cli_main(shlex.split(suggested)[3:]) == 0
    require_verified(cfg, sets)


def _to_int32(prefix: Path) -> None:
    """Rewrite an indexed dataset with int32 tokens (what a tokenizer of more than 65,536 ids
    would give): same documents, .bin twice as large, the .idx's dtype and pointers changed."""
    info = read_index(prefix)
    tokens = np.fromfile(f"{prefix}.bin", dtype=np.uint16).astype(np.int32)
    tokens.tofile(f"{prefix}.bin")
    raw = bytearray(Path(f"{prefix}.idx").read_bytes())
    raw[17] = 4                                         # dtype code: int32
    s = info.sequences
    ptr = np.frombuffer(bytes(raw[34 + 4 * s:34 + 12 * s]), dtype=np.int64) * 2
    raw[34 + 4 * s:34 + 12 * s] = ptr.tobytes()
    assert struct.unpack("<B", raw[17:18])[0] == 4
    Path(f"{prefix}.idx").write_bytes(bytes(raw))


def test_after_a_dtype_change_the_suggested_write_manifest_fixes_it(data, capsys):
    """Before: `data verify --write-manifest` returned the same size error and suggested itself
    again. Now it records the changed files (a warning names each) and training's check passes."""
    cfg = _cfg(data)
    verify_data(cfg)
    _to_int32(data / EN6)
    with pytest.raises(DataError, match=r"size or mtime changed .*data verify \S+` first"):
        require_verified(cfg)
    with pytest.raises(DataError, match=rf"{EN6}\.bin: size \d+ bytes, manifest says \d+; .*run "
                       r"`python -m llama31_405b data verify .* --write-manifest`") as e:
        verify_data(cfg)
    logs = []
    verify_data(cfg, write_manifest=True, log=logs.append)
    assert any(m.startswith(f"warning: {data}/{EN6}.bin: size") and "recording it as it is now"
               in m for m in logs), logs
    assert require_verified(cfg)["datasets"][EN6]["dtype"] == "int32"
    verify_data(cfg)                                   # and without the flag, from now on
    assert "--write-manifest" in str(e.value)


def _init_without_model(rank: int, config: str, sets: list, ckpt: str, out: str) -> None:
    """Run.execute with the model build replaced by a recorder: what init did before the first
    failure, and the run's reason."""
    from llama31_405b.config import load_config
    from llama31_405b.config.overrides import parse_sets
    from llama31_405b.model import builder
    from llama31_405b.train.loop import Run
    built = []

    def build_model(*a, **k):
        built.append(True)
        raise RuntimeError("the model was built")
    builder.build_model = build_model
    cfg = load_config(config, overrides=parse_sets(sets))
    run = Run(cfg, seed=1, hooks=[], init_checkpoint=ckpt or None, sets=sets)
    status = run.execute()
    Path(out).write_text(json.dumps({"status": status, "reason": run.state.reason,
                                     "built": bool(built),
                                     "kind": type(run.failure).__name__}))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["tokenizer", "unverified", "checkpoint"])
def test_train_refuses_bad_inputs_before_it_builds_the_model(data, tmp_path, case):
    """The training run's init, with the model build watched: a missing tokenizer, unverified
    data, a checkpoint of another model each end the run before the model is built, the
    reason naming the key (and the user's --set in the suggested command)."""
    from llama31_405b.config import load_config
    config = _config_file(tmp_path)
    sets = [f"data.data_dir={data}"]
    cfg = load_config(config, overrides={"data": {"data_dir": str(data)}})
    ckpt = ""
    if case == "tokenizer":
        sets.append('data.tokenizer="tokenizer/none.model"')
    elif case == "checkpoint":
        verify_data(cfg)
        ckpt = str(_checkpoint(tmp_path / "ck", cfg, num_layers=cfg.model.num_layers + 1))
    out = tmp_path / "out.json"
    zygote.spawn(_init_without_model, (str(config), sets, ckpt, str(out)), 1, launcher="single",
                 timeout=300, check=True)
    res = json.loads(out.read_text())
    assert res["status"] == "aborted" and not res["built"], res
    want = {"tokenizer": (f"data.tokenizer = {data}/tokenizer/none.model: not found", "DataError"),
            "unverified": (f"data verify {config} --set data.data_dir={data}`", "DataError"),
            "checkpoint": (f"--init-checkpoint = {ckpt}: checkpoint does not match",
                           "CheckpointError")}[case]
    assert want[0] in res["reason"] and res["kind"] == want[1], res
