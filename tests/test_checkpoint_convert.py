"""Hugging Face Llama 3.1 -> Megatron distributed checkpoint: mapping, checks, conversion,
resume, and loading at TP1 and TP2xPP2 with logits equal to the Hugging Face model's; the chunks
of a TP (checkpoint.chunking): what megatron-core requests at that TP, one chunk per request, and
both chunkings loading bit for bit at their own TP and another."""
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

WORKER = Path(__file__).resolve().parent / "helpers" / "ckpt_load_worker.py"
ZIP_OVERHEAD = 4096
"""Bytes torch.save adds around each stored chunk (zip headers, pickle), an upper bound."""
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


@pytest.fixture(scope="session")
def converted_tp2(hf_dir, tmp_path_factory) -> tuple[Path, Path]:
    """(config, Megatron checkpoint) converted through the CLI with a TP2 config: the chunks
    megatron-core requests at TP2."""
    from llama31_405b.cli import main
    root = tmp_path_factory.mktemp("conv_tp2")
    cfg = write_config(root / "tp2.toml", tp=2)
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


@pytest.mark.parametrize("tp", [1, 2])
def test_other_hidden_size_fails_before_writing(hf_dir, tmp_path, capsys, tp):
    from llama31_405b.cli import main
    cfg = write_config(tmp_path / "h96.toml", hidden_size=96, tp=tp)
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


# ---------------------------------------------------------------- the chunks of a TP

def test_chunks_of_a_tp_that_does_not_divide_are_refused_before_writing(hf_dir, tmp_path,
                                                                        capsys):
    from llama31_405b.cli import main
    cfg = write_config(tmp_path / "tp1.toml")
    out = tmp_path / "never"
    rc = main(["checkpoint", "convert", "--hf", str(hf_dir), "--config", str(cfg),
               "--chunks-tp", "3", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--chunks-tp 3" in err and "model.num_query_groups = 2 is not divisible by TP 3" in err
    assert "model.ffn_hidden_size = 160 is not divisible by TP 3" in err
    assert "--chunks-tp 1 for whole layers" in err
    assert not out.exists()


def test_chunking_splits_as_megatron_and_counts_what_a_request_reads():
    """checkpoint.chunking on the small model at TP2: the stored pieces of each split tensor,
    the vocab cut at the true rows, and the bytes a request pays for."""
    from llama31_405b.checkpoint.chunking import Chunking, ChunkingError, problems
    model = ModelConfig(num_layers=4, hidden_size=64, ffn_hidden_size=160, num_attention_heads=8,
                        num_query_groups=2, kv_channels=8, vocab_size=320)
    c = Chunking.for_model(model, 2)
    assert c.vocab_chunk_rows == 256                      # 320 padded to 512 at TP2, over 2
    assert c.intervals(mapping.EMBED, 0, 320) == [(0, 256), (256, 320)]
    assert c.intervals(mapping.FC1, 0, 320) == [(0, 80), (80, 160), (160, 240), (240, 320)]
    assert c.intervals(mapping.PROJ, 1, 64) == [(0, 32), (32, 64)]
    assert c.intervals(mapping.PROJ, 0, 64) == [(0, 64)]
    assert c.intervals(mapping.ATTN_NORM, 0, 64) == [(0, 64)]
    assert c.owners(mapping.FC1, (320, 64)) == [0, 1] and c.owners(mapping.MLP_NORM, (64,)) == [0]
    # a TP2 request reads its own chunk; the same request against whole layers reads the layer
    whole = Chunking.for_model(model, 1)
    assert c.read_bytes(mapping.PROJ, (64, 64), (0, 32), (64, 32), 4) == 64 * 32 * 4
    assert whole.read_bytes(mapping.PROJ, (64, 64), (0, 32), (64, 32), 4) == 64 * 64 * 4
    # the padded vocab rows [256, 512) of TP rank 1 overlap the stored [256, 320) only
    assert c.read_bytes(mapping.EMBED, (320, 64), (256, 0), (256, 64), 4) == 64 * 64 * 4
    assert problems(model, 3) == ["model.num_attention_heads = 8 is not divisible by TP 3",
                                  "model.num_query_groups = 2 is not divisible by TP 3",
                                  "model.ffn_hidden_size = 160 is not divisible by TP 3"]
    with pytest.raises(ChunkingError, match="not divisible by TP 4"):
        Chunking.for_model(model, 4)
    assert Chunking.of_record({}, model) == whole         # records from before the chunking
    assert Chunking.of_record({"chunking": c.record()}, model) == c
    with pytest.raises(ChunkingError, match="is not a chunking record"):
        Chunking.of_record({"chunking": {"tp": "2"}}, model)


@pytest.mark.slow
def test_tp_chunks_are_what_megatron_requests_and_load_bit_exact_at_any_tp(
        converted, converted_tp2, hf_dir, tmp_path):
    """A TP2 config's conversion stores each tensor in megatron-core's TP2 pieces (the record
    says so); loaded at TP2 (2 gloo ranks) every request finds exactly one stored chunk, its own,
    and is read once; loaded at TP1, and the whole-layer conversion at TP2, torch DCP reshards.
    Every requested tensor equals the Hugging Face weights bit for bit (padded vocab rows zero),
    and the read plan predicts each rank's bytes."""
    from torch.distributed.checkpoint import FileSystemReader
    cfg2, tp2 = converted_tp2
    _, tp1 = converted
    info = json.loads((tp2 / "llama31_405b.json").read_text())
    assert info["chunking"] == {"tp": 2, "vocab_chunk_rows": 256}
    md = FileSystemReader(str(tp2)).read_metadata().state_dict_metadata
    L = SMALL["num_hidden_layers"]
    assert len(md[mapping.QKV].chunks) == 2 * L and len(md[mapping.FC1].chunks) == 4 * L
    assert len(md[mapping.ATTN_NORM].chunks) == L and len(md[mapping.EMBED].chunks) == 2
    assert tuple(md[mapping.EMBED].size) == (SMALL["vocab_size"], SMALL["hidden_size"])
    stored, norms = _stored_bytes(tp2), _stored_bytes(tp2, "norm")

    def run(cfg, nproc, ckpts):
        out = tmp_path / f"chunks_{nproc}.json"
        r = zygote.run_script(WORKER, ["chunks", cfg, hf_dir, json.dumps(list(map(str, ckpts))),
                                       out], nproc, timeout=300)
        assert r.returncode == 0, r.stderr[-4000:]
        return json.loads(out.read_text())
    at_tp2 = run(cfg2, 2, [tp2, tp1])
    cfg1 = write_config(tmp_path / "tp1.toml")
    (at_tp1,) = run(cfg1, 1, [tp2])
    for rank in at_tp2 + [at_tp1]:
        for r in rank:
            assert r["differ"] == [], r
            assert abs(r["bytes_read"] - r["predicted"]["after_bytes"]) \
                <= ZIP_OVERHEAD * r["chunks_read"], r
    own, whole = [rank[0] for rank in at_tp2], [rank[1] for rank in at_tp2]
    # TP2 chunks at TP2: each request is one chunk of its own; each rank reads its own chunks,
    # the two ranks every chunk once (the replicated norms each)
    assert all(r["not_own_chunk"] == [] for r in own), own
    assert all(r["chunks_read"] == r["requests"] for r in own)
    assert sum(r["chunks_read"] for r in own) == stored[0] + norms[0]
    assert sum(r["bytes_read"] for r in own) == stored[1] + norms[1]
    # whole layers at TP2: every rank reads every stored chunk (the layers whole), so the two
    # read the checkpoint twice
    assert all(r["not_own_chunk"] for r in whole)
    assert all((r["chunks_read"], r["bytes_read"]) == _stored_bytes(tp1) for r in whole), whole
    # TP2 chunks at TP1: the one rank reads every chunk once
    assert (at_tp1[0]["chunks_read"], at_tp1[0]["bytes_read"]) == stored


def _stored_bytes(ckpt: Path, containing: str = "") -> tuple[int, int]:
    """(tensor chunks, their bytes on disk) in the checkpoint's DCP index, of the tensors whose
    key contains `containing`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    md = FileSystemReader(str(ckpt)).read_metadata()
    items = [i for i in md.storage_data if containing in i.fqn
             and isinstance(md.state_dict_metadata[i.fqn], TensorStorageMetadata)]
    return len(items), sum(md.storage_data[i].length for i in items)
