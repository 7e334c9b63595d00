"""Hugging Face Llama 3.1 -> Megatron distributed checkpoint: mapping, checks, conversion,
resume, and loading at TP1 and TP2xPP2 with logits equal to the Hugging Face model's."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from checkpoint_helpers import SMALL, make_hf_llama, verify_rank, write_config
from helpers.ports import free_port
from helpers import zygote

from llama31_405b.checkpoint import mapping
from llama31_405b.config.load import load_config
from llama31_405b.config.schema import ModelConfig

TINY = ModelConfig(num_layers=2, hidden_size=16, ffn_hidden_size=24, num_attention_heads=4,
                   num_query_groups=2, kv_channels=4, vocab_size=40)


# ---------------------------------------------------------------- pure mapping logic

def test_qkv_fusion_matches_megatron_split():
    """Rows of the fused QKV, split the way Megatron's SelfAttention splits them, give back the
    HF q heads of each group and that group's k and v."""
    m = TINY
    d, ng, nh = m.kv_channels, m.num_query_groups, m.num_attention_heads
    q = torch.randn(nh * d, m.hidden_size)
    k = torch.randn(ng * d, m.hidden_size)
    v = torch.randn(ng * d, m.hidden_size)
    src = {"q": q, "k": k, "v": v}
    target = next(t for t in mapping.targets(m) if t.key == mapping.QKV and t.layer == 0)
    names = dict(zip(target.sources, "qkv"))
    fused = mapping.fill(target, m, lambda n: src[names[n]], torch.float32)
    per = nh // ng
    groups = fused.view(ng, (per + 2) * d, m.hidden_size)
    mq, mk, mv = torch.split(groups, [per * d, d, d], dim=1)
    assert torch.equal(mq.reshape(nh * d, -1), q)
    assert torch.equal(mk.reshape(ng * d, -1), k)
    assert torch.equal(mv.reshape(ng * d, -1), v)


def test_fc1_is_gate_then_up():
    m = TINY
    gate, up = torch.randn(m.ffn_hidden_size, 16), torch.randn(m.ffn_hidden_size, 16)
    target = next(t for t in mapping.targets(m) if t.key == mapping.FC1)
    src = dict(zip(target.sources, (gate, up)))
    fused = mapping.fill(target, m, src.__getitem__, torch.bfloat16)
    assert fused.dtype == torch.bfloat16
    assert torch.equal(fused.float(), torch.cat([gate, up]).bfloat16().float())


def _fake_tensors(m: ModelConfig, **changes):
    t = {n: SimpleNamespace(shape=s, dtype="BF16")
         for n, s in mapping.expected_hf_shapes(m).items()}
    t.update(changes)
    return t


def test_check_accepts_matching_checkpoint():
    mapping.check(_fake_tensors(TINY), {"hidden_size": 16, "tie_word_embeddings": False,
                                        "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
                  TINY, "ckpt")


def test_check_names_every_problem():
    bad = _fake_tensors(TINY)
    bad["model.layers.1.mlp.down_proj.weight"] = SimpleNamespace(shape=(16, 99), dtype="BF16")
    bad["model.layers.0.self_attn.q_proj.weight"] = SimpleNamespace(shape=(16, 16), dtype="I8")
    del bad["model.norm.weight"]
    bad["model.layers.0.self_attn.q_proj.bias"] = SimpleNamespace(shape=(16,), dtype="BF16")
    with pytest.raises(mapping.ConversionError) as e:
        mapping.check(bad, {"num_key_value_heads": 8}, TINY, "ckpt")
    msg = str(e.value)
    assert "model.layers.1.mlp.down_proj.weight is (16, 99)" in msg and "needs (16, 24)" in msg
    assert "q_proj.weight is I8" in msg
    assert "missing tensors (1): model.norm.weight" in msg
    assert "unexpected tensors (1): model.layers.0.self_attn.q_proj.bias" in msg
    assert "num_key_value_heads = 8" in msg and "num_query_groups = 2" in msg


def test_check_vocab_mismatch_is_explained():
    other = ModelConfig(num_layers=2, hidden_size=16, ffn_hidden_size=24, num_attention_heads=4,
                        num_query_groups=2, kv_channels=4, vocab_size=32)
    with pytest.raises(mapping.ConversionError, match=r"embedding has 40 rows but the config has "
                       r"model.vocab_size = 32"):
        mapping.check(_fake_tensors(TINY), {}, other, "ckpt")


# ---------------------------------------------------------------- conversion with Megatron

@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory) -> Path:
    return make_hf_llama(tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture(scope="session")
def converted(hf_dir, tmp_path_factory) -> tuple[Path, Path]:
    """(config, Megatron checkpoint) converted once through the CLI."""
    from llama31_405b.cli import main
    root = tmp_path_factory.mktemp("conv")
    cfg = write_config(root / "tp1.toml")
    out = root / "megatron"
    assert main(["checkpoint", "convert", "--hf", str(hf_dir), "--config", str(cfg),
                 "--out", str(out)]) == 0
    return cfg, out


def _verify(config: Path, hf: Path, megatron: Path, world: int, tmp: Path) -> dict:
    result = tmp / f"verify_{world}.json"
    port = free_port()
    if world == 1:
        verify_rank(0, 1, port, str(config), str(hf), str(megatron), str(result))
    else:
        # the ranks fork from the preloaded zygote (tests/helpers/zygote.py)
        zygote.spawn(_spawn_entry, (world, port, str(config), str(hf), str(megatron),
                                    str(result)), world, check=True)
    return json.loads(result.read_text())


def _spawn_entry(rank, *args):
    verify_rank(rank, *args)


def test_convert_writes_a_joined_torch_dist_checkpoint(converted, hf_dir):
    assert (hf_dir / "model.safetensors.index.json").is_file()   # read through the shard index
    _, out = converted
    names = {p.name for p in out.iterdir()}
    assert {".metadata", "metadata.json", "llama31_405b.json"} <= names
    assert not (out / ".convert_parts").exists()
    assert json.loads((out / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    from torch.distributed.checkpoint import FileSystemReader
    md = FileSystemReader(str(out)).read_metadata().state_dict_metadata
    qkv = md[mapping.QKV]
    h, L = SMALL["hidden_size"], SMALL["num_hidden_layers"]
    rows = (SMALL["num_attention_heads"] + 2 * SMALL["num_key_value_heads"]) * SMALL["head_dim"]
    assert tuple(qkv.size) == (L, rows, h) and len(qkv.chunks) == L
    assert tuple(md[mapping.EMBED].size) == (SMALL["vocab_size"], h)   # stored unpadded


def test_tp1_logits_match_hugging_face(converted, hf_dir, tmp_path):
    cfg, out = converted
    r = _verify(cfg, hf_dir, out, 1, tmp_path)
    assert r["max_abs_logit"] > 0.5          # the comparison is not between near-zero logits
    assert r["max_abs_diff"] < 1e-4, r
    assert r["argmax_agreement"] == 1.0


def test_training_loader_reads_converted_checkpoint(converted, hf_dir):
    """checkpoint.format.load (what a training run calls) accepts the converted
    checkpoint and yields the Hugging Face logits."""
    import socket

    from llama31_405b.checkpoint.verify import compare, hf_logits, megatron_logits, sample_tokens
    from llama31_405b.model.builder import build_model
    from llama31_405b.parallel.distributed import DistEnv
    from llama31_405b.parallel.setup import seed_model_parallel, setup_parallel, teardown_parallel
    from llama31_405b.checkpoint import format as ckpt_format
    cfg_path, out = converted
    cfg = load_config(cfg_path)
    setup_parallel(cfg, DistEnv(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1",
                                master_port=free_port(), hostname=socket.gethostname(),
                                launcher="single"))
    try:
        seed_model_parallel(1)
        chunks = build_model(cfg)
        info = ckpt_format.load(chunks, out, cfg)
        tokens = sample_tokens(cfg.model.vocab_size, 2, 8, seed=3)
        diff, _, agree = compare(megatron_logits(cfg, chunks, tokens), hf_logits(hf_dir, tokens))
    finally:
        teardown_parallel()
    assert info["converted_from"]["format"] == "huggingface-safetensors"
    assert diff < 1e-4 and agree == 1.0


@pytest.mark.slow
def test_tp2_pp2_logits_match_hugging_face(converted, hf_dir, tmp_path):
    """Four gloo ranks: QKV/fc1 split over TP by Megatron's resharding, layers over PP, the vocab
    (320) padded differently than at TP1 (384 -> 512)."""
    _, out = converted
    cfg = write_config(tmp_path / "tp2pp2.toml", tp=2, pp=2)
    assert load_config(cfg).derived.padded_vocab_size == 512
    r = _verify(cfg, hf_dir, out, 4, tmp_path)
    assert r["max_abs_diff"] < 1e-4, r


@pytest.mark.slow
def test_pp2_vp2_logits_match_hugging_face(converted, hf_dir, tmp_path):
    """Two ranks, interleaved pipeline: one layer per virtual stage (chunks model0/model1)."""
    _, out = converted
    cfg = write_config(tmp_path / "pp2vp2.toml", pp=2, vp=2)
    r = _verify(cfg, hf_dir, out, 2, tmp_path)
    assert r["max_abs_diff"] < 1e-4, r


def test_verify_cli_reports_and_passes(converted, hf_dir, monkeypatch, capsys):
    from llama31_405b.cli import main
    cfg, out = converted
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    rc = main(["checkpoint", "verify", "--hf", str(hf_dir), "--megatron", str(out),
               "--config", str(cfg), "--sequences", "2", "--seq-len", "8"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "max |logit diff|" in text and "PASS" in text


def test_other_hidden_size_fails_before_writing(hf_dir, tmp_path, capsys):
    from llama31_405b.cli import main
    cfg = write_config(tmp_path / "h96.toml", hidden_size=96)
    out = tmp_path / "never"
    rc = main(["checkpoint", "convert", "--hf", str(hf_dir), "--config", str(cfg),
               "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "model.embed_tokens.weight is (320, 64) in the checkpoint but the config needs " \
           "(320, 96)" in err
    assert "model.layers.0.self_attn.q_proj.weight is (64, 64) in the checkpoint but the " \
           "config needs (96, 96)" in err
    assert not out.exists()


def test_interrupted_conversion_resumes(hf_dir, tmp_path, monkeypatch):
    """A conversion killed after a few tensors continues where it stopped, skipping the finished
    parts, and the result loads with the Hugging Face logits."""
    from llama31_405b.checkpoint import convert as conv
    cfg = load_config(write_config(tmp_path / "c.toml"))
    out = tmp_path / "resumed"
    real, calls = conv.save_part, []

    def dying(sharded, part):
        if len(calls) == 6:
            raise KeyboardInterrupt("simulated kill")
        calls.append(part.name)
        real(sharded, part)
    monkeypatch.setattr(conv, "save_part", dying)
    with pytest.raises(KeyboardInterrupt):
        conv.convert(hf_dir, cfg, out, log=lambda s: None)
    assert (out / ".convert_parts").is_dir() and not (out / ".metadata").exists()
    monkeypatch.setattr(conv, "save_part", real)
    lines = []
    r = conv.convert(hf_dir, cfg, out, log=lines.append)
    assert r.resumed_parts == 5 and "resuming, 5 already written" in lines[0]
    assert _verify(cfg.source, hf_dir, out, 1, tmp_path)["max_abs_diff"] < 1e-4


def test_join_refuses_incomplete_coverage():
    """A layer chunk missing or written twice is caught when the parts are joined."""
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata,
                                                       TensorProperties, TensorStorageMetadata)

    from llama31_405b.checkpoint.dcp_parts import CheckpointJoinError, _check_coverage

    def md(offsets):
        return {"w": TensorStorageMetadata(
            properties=TensorProperties(dtype=torch.float32), size=torch.Size([3, 4, 2]),
            chunks=[ChunkStorageMetadata(offsets=torch.Size([i, 0, 0]),
                                         sizes=torch.Size([1, 4, 2])) for i in offsets])}
    _check_coverage(md([0, 1, 2]))
    for bad in ([0, 2], [0, 1, 1]):
        with pytest.raises(CheckpointJoinError, match="tensor w: chunks cover"):
            _check_coverage(md(bad))


def test_405b_model_matches_the_mapping():
    """The real 405B config, built on the meta device (no memory): Megatron's sharded state dict
    has exactly the 759 tensors the mapping fills (6 per layer x 126 + 3)."""
    from llama31_405b.checkpoint.convert import (_index_template, sharded_template,
                                                 single_process_megatron)
    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml")
    with single_process_megatron():
        tensors, objects = _index_template(sharded_template(cfg), cfg)
    assert len(tensors) == len(mapping.targets(cfg.model)) == 6 * 126 + 3
    entry = tensors[(mapping.QKV, 125)][1]
    assert tuple(entry.local_shape) == ((128 + 2 * 8) * 128, 16384)
