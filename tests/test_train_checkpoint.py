"""Checkpoint guard: a checkpoint of another model or an incomplete one is refused by name."""
import json

import pytest

from llama31_405b.config import load_config
from llama31_405b.train.checkpoint import CheckpointError, MODEL_INFO, check_compatible


def _fake_ckpt(path, **model):
    path.mkdir()
    (path / "metadata.json").write_text("{}")
    (path / MODEL_INFO).write_text(json.dumps(model))
    return path


def test_incomplete_checkpoint_is_refused(tmp_path):
    cfg = load_config("configs/tiny_cpu.toml")
    with pytest.raises(CheckpointError, match="no complete Megatron distributed checkpoint"):
        check_compatible(tmp_path, cfg)


def test_other_model_is_refused_naming_the_fields(tmp_path):
    cfg = load_config("configs/tiny_cpu.toml")
    m = cfg.model
    fields = {k: getattr(m, k) for k in ("num_layers", "hidden_size", "ffn_hidden_size",
                                         "num_attention_heads", "num_query_groups",
                                         "kv_channels", "vocab_size")}
    assert check_compatible(_fake_ckpt(tmp_path / "ok", **fields), cfg)["hidden_size"] == 128
    bad = _fake_ckpt(tmp_path / "bad", **{**fields, "hidden_size": 256})
    with pytest.raises(CheckpointError, match="hidden_size: checkpoint 256 vs config 128"):
        check_compatible(bad, cfg)
