"""What a new user's bad inputs found (issue 45), the inputs `train` checks first:

- item 8: a data file of the initial checkpoint deleted or cut short is refused by the cheap
  pre-check (train.inputs, before the model is built), naming the key and the fix, exit 2;
  before, torch's raw FileNotFoundError came out of the load, after the model build, exit 1;
- item 10: a .idx whose dtype disagrees with its .bin: the message says what the manifest
  records."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import zygote
from llama31_405b.checkpoint.format import MODEL_INFO, SHAPE_KEYS, CheckpointError
from llama31_405b.failures import EXIT_INPUT, exit_code
from llama31_405b.train.inputs import check_inputs
from test_data_verify import _cfg, prepared  # noqa: F401  (the module's data fixture)
from test_train_checks_first import (EN6, _config_file, _init_without_model,  # noqa: F401
                                      data)


def _dcp_checkpoint(path: Path, cfg) -> Path:
    """A checkpoint folder whose index and data files torch.distributed.checkpoint wrote (two
    data files), with cfg's record: what the pre-check reads of a real one."""
    import torch
    import torch.distributed.checkpoint as dcp
    writer = dcp.FileSystemWriter(str(path), thread_count=2, single_file_per_rank=True)
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"a": torch.ones(64), "b": torch.zeros(8, 8)}, storage_writer=writer)
    (path / "metadata.json").write_text("{}")
    (path / MODEL_INFO).write_text(json.dumps({k: getattr(cfg.model, k) for k in SHAPE_KEYS}))
    return path


def test_a_missing_or_short_data_file_is_refused_by_key(data):  # noqa: F811
    cfg = _cfg(data, require_verified=False)
    ck = _dcp_checkpoint(data.parent / "ck", cfg)
    cfg.checkpoint.ckpt_dir, cfg.checkpoint.init = str(ck.parent), ck.name
    assert check_inputs(cfg, init_checkpoint=None).checkpoint == str(ck)
    files = sorted(ck.glob("*.distcp"))
    assert len(files) == 2
    size = files[1].stat().st_size
    files[1].write_bytes(files[1].read_bytes()[:-10])
    with pytest.raises(CheckpointError) as e:
        check_inputs(cfg, init_checkpoint=None)
    assert str(e.value).startswith(
        f"checkpoint.ckpt_dir/checkpoint.init = {ck}: {files[1].name}: {size - 10} bytes, the "
        f"index records {size}: the checkpoint's .metadata names data files")
    files[0].unlink()
    with pytest.raises(CheckpointError) as e:
        check_inputs(cfg, init_checkpoint=str(ck))
    assert str(e.value).startswith(
        f"--init-checkpoint = {ck}: {files[0].name}: missing (and 1 more file(s)): the "
        "checkpoint's .metadata names data files that are not all there")
    assert "copy the whole checkpoint folder again" in str(e.value)
    assert exit_code(e.value) == EXIT_INPUT == 2
    (ck / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match=r"= \S+: \.metadata cannot be read \(.*damaged"):
        check_inputs(cfg, init_checkpoint=str(ck))


@pytest.mark.slow      # a training run's init in a process of its own
def test_train_stops_before_the_model_build_on_a_missing_data_file(data, tmp_path):  # noqa: F811
    from llama31_405b.config import load_config
    from llama31_405b.data.verify import verify_data
    config = _config_file(tmp_path)
    sets = [f"data.data_dir={data}"]
    cfg = load_config(config, overrides={"data": {"data_dir": str(data)}})
    verify_data(cfg)
    ck = _dcp_checkpoint(tmp_path / "ck", cfg)
    gone = sorted(ck.glob("*.distcp"))[0]
    gone.unlink()
    out = tmp_path / "out.json"
    zygote.spawn(_init_without_model, (str(config), sets, str(ck), str(out)), 1,
                 launcher="single", timeout=300, check=True)
    res = json.loads(out.read_text())
    assert res["status"] == "aborted" and not res["built"], res
    assert res["kind"] == "CheckpointError", res
    assert f"--init-checkpoint = {ck}: {gone.name}: missing" in res["reason"], res


def test_a_changed_idx_dtype_names_what_the_manifest_records(data):  # noqa: F811
    from llama31_405b.data import DataError
    from llama31_405b.data.verify import check_metadata, verify_data
    cfg = _cfg(data)
    verify_data(cfg)
    idx = data / f"{EN6}.idx"
    raw = bytearray(idx.read_bytes())
    raw[17] = 4                     # the dtype code: int32 (the .bin stays uint16)
    idx.write_bytes(bytes(raw))
    recorded = (f"; the manifest {data}/manifest.json records uint16 tokens for {EN6} (restore "
                "the files it describes, or prepare the data again)")
    with pytest.raises(DataError) as e:
        check_metadata(cfg)         # what train and require_verified run first
    assert str(e.value).startswith(f"data.train_prefixes[0] = {EN6}: ")
    assert "int32 tokens" in str(e.value) and str(e.value).endswith(recorded)
    with pytest.raises(DataError) as e:
        verify_data(cfg)            # `data verify`
    assert "int32" in str(e.value) and str(e.value).endswith(recorded)
