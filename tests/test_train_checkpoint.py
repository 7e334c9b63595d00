"""checkpoint.format, the one owner of the Megatron checkpoint: a checkpoint of another model or
an incomplete one is refused by name; a save/load round trip restores the weights in place and
never reads `_extra_state` (the extra-state policy); the model-info file is what both writers
write."""
import json
import socket

import pytest
import torch

from checkpoint_helpers import empty_dcp_index
from helpers.ports import free_port
from llama31_405b.checkpoint import format as ckpt_format
from llama31_405b.checkpoint.format import CheckpointError, MODEL_INFO, check_compatible
from llama31_405b.config import load_config


def _fake_ckpt(path, **model):
    path.mkdir()
    (path / "metadata.json").write_text("{}")
    (path / ".metadata").write_bytes(empty_dcp_index())
    (path / MODEL_INFO).write_text(json.dumps(model))
    return path


def test_incomplete_checkpoint_is_refused(tmp_path):
    cfg = load_config("configs/tiny_cpu.toml")
    with pytest.raises(CheckpointError, match="no complete Megatron distributed checkpoint"):
        check_compatible(tmp_path, cfg)
    (tmp_path / "metadata.json").write_text("{}")
    (tmp_path / ".metadata").write_bytes(b"")
    # a save that stopped before the model-info file (written last) is not complete
    with pytest.raises(CheckpointError, match=f"missing {MODEL_INFO}"):
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


class _TEStyleNorm(torch.nn.Module):
    """Like Transformer Engine's RMSNorm (an ops BasicOperation): a weight plus extra state."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))
        self.got = "unset"

    def get_extra_state(self):
        return torch.empty(0, dtype=torch.uint8)

    def set_extra_state(self, state):
        self.got = state


def _model():
    m = torch.nn.Module()
    m.final_layernorm, m.lin = _TEStyleNorm(), torch.nn.Linear(4, 4)
    return m


def test_weights_load_without_the_modules_extra_state():
    """A module with an `_extra_state` the checkpoint lacks (the GPU model's TE final norm and a
    CPU-converted checkpoint) loads, and its extra state is left as built, not set."""
    m = _model()
    weight = m.final_layernorm.weight
    ckpt = {"final_layernorm.weight": torch.full((4,), 2.0), "lin.weight": torch.zeros(4, 4),
            "lin.bias": torch.zeros(4)}
    ckpt_format.load_into(m, ckpt, "ckpt")
    assert m.final_layernorm.got == "unset"
    assert m.final_layernorm.weight is weight and float(weight[0]) == 2.0


def test_a_missing_or_foreign_weight_is_an_error():
    good = {"final_layernorm.weight": torch.ones(4), "lin.weight": torch.zeros(4, 4),
            "lin.bias": torch.zeros(4)}
    with pytest.raises(CheckpointError, match=r"lacking \['lin.bias'\]"):
        ckpt_format.load_into(_model(), {k: v for k, v in good.items() if k != "lin.bias"}, "c")
    with pytest.raises(CheckpointError, match=r"not in the model \['lin.scale'\]"):
        ckpt_format.load_into(_model(), {**good, "lin.scale": torch.ones(1)}, "c")


def test_every_extra_state_request_is_dropped_before_the_load():
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    obj = ShardedObject("decoder.final_layernorm._extra_state", None, (1,), (0,), replica_id=0)
    sharded = {"model0": {"decoder.final_layernorm._extra_state": obj, "w": 1},
               "model1": {"decoder.layers.0.mlp.linear_fc1._extra_state": obj, "w": 2}}
    assert ckpt_format.drop_extra_states(sharded) == ["decoder.final_layernorm._extra_state"] * 2
    assert sharded == {"model0": {"w": 1}, "model1": {"w": 2}}


@pytest.mark.slow
def test_save_then_load_restores_weights_in_place_without_reading_extra_state(tmp_path,
                                                                            monkeypatch):
    """One gloo rank, the tiny model, Megatron's own save and load: the reload puts the saved
    values into the same parameter tensors (what the warm-up's restore needs), the model-info
    file marks the checkpoint complete, and an extra state the checkpoint holds is written but
    never handed back to its module (at most megatron-core's own default, None)."""
    from torch.distributed.checkpoint import FileSystemReader

    from llama31_405b.model.builder import build_model
    from llama31_405b.parallel.distributed import DistEnv
    from llama31_405b.parallel.setup import seed_model_parallel, setup_parallel, teardown_parallel
    cfg = load_config("configs/tiny_cpu.toml")
    port = free_port()
    setup_parallel(cfg, DistEnv(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1",
                                master_port=port, hostname=socket.gethostname(),
                                launcher="single"))
    try:
        seed_model_parallel(1)
        chunks = build_model(cfg)
        qkv = chunks[0].decoder.layers[0].self_attention.linear_qkv
        marker = torch.arange(5, dtype=torch.uint8)
        monkeypatch.setattr(qkv, "get_extra_state", lambda: marker)
        saved = {n: p.detach().clone() for n, p in chunks[0].named_parameters()}
        ckpt_format.save(chunks, tmp_path / "ck", cfg, extra={"note": "test"})
        assert ckpt_format.is_complete(tmp_path / "ck")
        stored = FileSystemReader(str(tmp_path / "ck")).read_metadata().state_dict_metadata
        assert any(k.startswith("decoder.layers.self_attention.linear_qkv._extra_state")
                   for k in stored)
        got = []
        monkeypatch.setattr(qkv, "set_extra_state", got.append)
        params = dict(chunks[0].named_parameters())
        with torch.no_grad():
            for p in params.values():
                p.add_(1.0)
        info = ckpt_format.load(chunks, tmp_path / "ck", cfg)
    finally:
        teardown_parallel()
    assert all(v is None for v in got), got
    for n, p in chunks[0].named_parameters():
        assert p is params[n] and torch.equal(p, saved[n]), n
    assert info["note"] == "test" and info["model"]["hidden_size"] == 128
    assert info["padded_vocab_size_at_save"] == cfg.derived.padded_vocab_size
