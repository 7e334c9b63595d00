"""The rehearsal's parts that need no rank process: torch's fake backend (a private API, guarded
here), the rank choice, the synthetic Slurm allocation and the placement verdict on it, the
dataset index sizes against megatron-core's own index builders, the verdict and the CLI's
refusals before any process starts. End-to-end rehearsals: tests/test_rehearse_cli.py (slow)."""
from __future__ import annotations

import dataclasses
import inspect
import struct
from pathlib import Path

import numpy as np
import pytest

from llama31_405b.cli import main as cli_main
from llama31_405b.config import load_config
from llama31_405b.parallel.placement import PlacementError, layout_of
from llama31_405b.rehearse import allocation, dataset, report
from llama31_405b.rehearse.ranks import default_ranks, parse_ranks

REPO = Path(__file__).resolve().parents[1]
C128 = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"
C2048 = REPO / "configs" / "config_GB200_2048x4x8xtp4pp8cp2.toml"


def test_fake_backend_is_the_private_api_the_rehearsal_relies_on():
    """torch.testing._internal.distributed.fake_pg: FakeStore, the "fake" backend, real group
    ranks and sizes, and all-gathers that answer with the caller's own contribution (so the
    placement check must be given the host table, not gather it). Fails loudly on a torch that
    changed any of it."""
    import torch.distributed as dist

    from llama31_405b.rehearse.fake_world import BACKEND, fake_backend
    store_cls = fake_backend()
    assert issubclass(store_cls, dist.Store) and BACKEND == dist.Backend.FAKE == "fake"
    assert not dist.is_initialized()
    dist.init_process_group(backend=BACKEND, store=store_cls(), rank=5, world_size=8192)
    try:
        assert (dist.get_rank(), dist.get_world_size()) == (5, 8192)
        g = dist.new_group([4, 5, 6, 7])
        assert dist.get_process_group_ranks(g) == [4, 5, 6, 7] and dist.get_rank(g) == 1
        out = [None] * 4
        dist.all_gather_object(out, ("rack7", 5), group=g)
        assert out == [("rack7", 5)] * 4       # no data moved: every slot is this rank's
    finally:
        dist.destroy_process_group()


def test_distributed_optimizer_still_sorts_parameters_by_cuda_type_name():
    """meta_compat answers tensor.type() with CUDA names because megatron-core's distributed
    optimizer accepts only those; if Megatron stops doing so the patch is stale."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    src = inspect.getsource(DistributedOptimizer)
    assert "'torch.cuda.BFloat16Tensor'" in src and "'torch.cuda.FloatTensor'" in src
    from llama31_405b.rehearse.meta_compat import _CUDA_TYPE
    assert set(_CUDA_TYPE.values()) >= {"torch.cuda.BFloat16Tensor", "torch.cuda.FloatTensor"}


def test_default_ranks_cover_every_stage_and_each_tp_cp_position():
    cfg = load_config(C2048)
    ranks = default_ranks(cfg)
    layout = layout_of(cfg)
    coords = [layout.coords(r) for r in ranks]
    assert [c["pp"] for c in coords] == list(range(8))            # first ... last stage
    positions = sorted((c["tp"], c["cp"]) for c in coords)
    assert positions == [(t, c) for t in range(4) for c in range(2)]
    assert coords[0]["dp"] == 0 and coords[-1]["dp"] == 127 and ranks[-1] == 8191


def test_parse_ranks():
    assert parse_ranks("0,5,8-10,5", 16) == [0, 5, 8, 9, 10]
    for bad in ("16", "3-2", "x", ","):
        with pytest.raises(ValueError, match="--ranks"):
            parse_ranks(bad, 16)


def test_synthetic_allocation_passes_the_placement_check():
    """The project's check_placement, as rank 8191 runs it, on the synthetic allocation: every
    rank places itself from its (synthetic) NVLink fabric, with the config's launch_env."""
    cfg = load_config(C2048)
    alloc = allocation.synthetic(cfg)
    assert len(alloc.hosts) == 2048 and len(set(alloc.racks)) == 128
    found, _ = allocation.check(cfg, alloc, rank=8191)
    assert len(found) == 8192 and {p.source for p in found} == {"fabric"}
    assert found[8191].rack.endswith("/rack127") and found[63].rack != found[64].rack
    _, logged = allocation.check(cfg, alloc, rank=0)          # rank 0 logs the rack map
    assert logged.startswith("placement: 128 rack(s), world 8192")


def test_the_gather_is_answered_only_with_the_callers_own_row():
    import torch.distributed as dist
    from llama31_405b.parallel.placement import Placement
    table = [Placement(rank=0, host="a", rack="r", source="host"),
             Placement(rank=1, host="b", rack="r", source="host")]
    out, real = [None, None], dist.all_gather_object
    with allocation.answered_gather(table):
        dist.all_gather_object(out, table[1])
        assert out == table
        with pytest.raises(RuntimeError, match="rank 1 reports"):
            dist.all_gather_object(out, Placement(rank=1, host="c", rack="r", source="host"))
    assert dist.all_gather_object is real


def _interleaved(path: Path) -> Path:
    """The 8-rack allocation with racks 0 and 1 interleaved node by node."""
    lines = []
    for n in range(1, 17):
        lines += [f"r000n{n:02d} rack000", f"r001n{n:02d} rack001"]
    for r in range(2, 8):
        lines += [f"r{r:03d}n{n:02d} rack{r:03d}" for n in range(1, 17)]
    path.write_text("# host rack\n" + "\n".join(lines) + "\n")
    return path


def test_interleaved_allocation_is_refused_naming_the_split_groups(tmp_path):
    cfg = load_config(C128)
    alloc = allocation.read_allocation(_interleaved(tmp_path / "alloc.txt"))
    with pytest.raises(PlacementError, match=r"CP group ranks 0,4 spans racks: rack \S+/rack000 "
                                             r"\(rank 0 on r000n01\); rack \S+/rack001"):
        allocation.check(cfg, alloc)


def test_allocation_file_errors_name_file_and_line(tmp_path):
    cfg = load_config(C128)
    bad = tmp_path / "a.txt"
    bad.write_text("h1 rack0\nh2\n")
    with pytest.raises(allocation.AllocationError, match=r"a.txt:2: expected 'HOST RACK'"):
        allocation.read_allocation(bad)
    bad.write_text("h1 r.0\n")
    with pytest.raises(allocation.AllocationError, match="contains '.'"):
        allocation.read_allocation(bad)
    bad.write_text("h1 r0\nh1 r0\n")
    with pytest.raises(allocation.AllocationError, match="h1 is listed twice"):
        allocation.read_allocation(bad)
    bad.write_text("h1 r0\n")
    with pytest.raises(PlacementError, match="fewer nodes than the 128"):
        allocation.check(cfg, allocation.read_allocation(bad))


def test_rack_of_host_in_the_config_wins_over_slurm(tmp_path):
    cfg = load_config(C128, overrides={"system": {"rack_of_host": {"r00[0-2]*": "A",
                                                                   "r00[3-7]*": "B"}}})
    found = allocation.report(cfg, allocation.synthetic(cfg))
    assert {p.source for p in found} == {"config"}
    with pytest.raises(PlacementError, match="racks hold different numbers of ranks"):
        allocation.check(cfg, allocation.synthetic(cfg))   # 3 racks + 5 racks


def _write_idx(prefix: Path, lengths: list[int]) -> None:
    """A megatron-core .idx (no .bin: the rehearsal reads only the index)."""
    n = len(lengths)
    ptr = np.concatenate([[0], np.cumsum(np.array(lengths[:-1], dtype=np.int64) * 2)])
    with open(str(prefix) + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, n, n + 1))
        f.write(np.array(lengths, dtype=np.int32).tobytes() + ptr.astype(np.int64).tobytes()
                + np.arange(n + 1, dtype=np.int64).tobytes())


def test_index_sizes_agree_with_megatrons_builders_on_real_idx_metadata(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        _write_idx(tmp_path / name, rng.integers(1, 3000, size=20_000).tolist())
    cfg = load_config(C128, overrides={"data": {"data_dir": str(tmp_path),
                                                "train_prefixes": ["a", "b"],
                                                "train_weights": [0.25, 0.75]},
                                       "run": {"division": "open", "max_steps": 20}})
    plan, lengths = dataset.plan(cfg)
    assert plan.samples == 20 * 1152 and [d.source for d in plan.datasets] == ["idx", "idx"]
    assert plan.datasets[0].documents == 20_000 and lengths[0] is not None
    assert plan.datasets[0].tokens == int(lengths[0].sum())
    assert plan.datasets[1].samples == pytest.approx(3 * plan.datasets[0].samples, rel=1e-3)
    assert plan.datasets[1].epochs > 1                                 # more than one pass
    dataset.time_build(plan, lengths, cfg)                             # full size: compared
    assert plan.problems == [] and plan.build_how == "measured at full size"
    assert plan.blend_bytes == plan.samples * 10


def test_shipped_config_index_from_the_c4_size_and_the_whole_schedule_is_far_larger():
    cfg = load_config(C2048)
    plan, lengths = dataset.plan(cfg)
    assert lengths == [None, None] and {d.source for d in plan.datasets} == {"C4 estimate"}
    assert plan.datasets[0].documents == 45_608_611 and plan.datasets[0].epochs == 1
    assert 0.3e9 < plan.total_bytes < 1e9
    schedule = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, max_steps=1_200_000,
                                                                division="open"))
    big, _ = dataset.plan(schedule)
    assert big.total_bytes > 100e9 and big.datasets[0].epochs > 100


def _rank(rank=0, **bytes_):
    b = dict(weights=25e9, grads=25e9, master_weights=3e9, optimizer_state=6e9,
             te_copies=14e9)
    b.update(bytes_)
    return {"rank": rank, "ok": True, "bytes": b, "groups": {"tp": 4}, "phases": {"model": 1.0},
            "wall_s": 9.0, "peak_rss": 8e8, "layers": [], "planner": dict(
        stage="middle", weights=25e9, grads=25e9, optimizer=9e9, te_copies=14e9,
        activations=58e9, fragmentation=12e9, reserved=10e9)}


def _rep(**over):
    rep = {"max_index_bytes": 10e9, "capacity_bytes": 186e9, "steps": 500, "gbs": 1152,
           "dataset": {"ok": True, "total_bytes": 0.44e9, "samples": 576000},
           "precheck": {"ok": True, "errors": []}, "ranks": [_rank()],
           "placement": {"ok": True, "racks": 8}}
    rep.update(over)
    return rep


def test_verdict_passes_a_fitting_rank_and_names_each_failure():
    assert report.verdict(_rep()) == {"ok": True, "exit_code": 0, "failures": [],
                                      "planner_check": []}
    big = report.verdict(_rep(ranks=[_rank(weights=80e9)]))
    assert big["exit_code"] == 1 and "does not fit in memory" in big["failures"][0]
    assert "planner weights" in big["planner_check"][0]
    index = report.verdict(_rep(dataset={"ok": True, "total_bytes": 150e9, "samples": 1}))
    assert "exceeds --max-index-gb 10" in index["failures"][0]
    placed = report.verdict(_rep(placement={"ok": False, "error": "placement check failed\n  x"},
                                 ranks=[]))
    assert placed["exit_code"] == 3 and placed["failures"] == ["placement: placement check "
                                                               "failed x"]
    dead = report.verdict(_rep(ranks=[{"rank": 3, "ok": False, "phase": "model",
                                       "error": "boom"}]))
    assert dead["failures"] == ["rank 3: model failed: boom"]


def test_cli_refuses_the_whole_schedule_at_load_and_bad_ranks(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'base = "{C128}"\n[run]\nmax_steps = 1200000\n')
    assert cli_main(["rehearse", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "run.max_steps = 1200000" in err and "samples" in err
    assert cli_main(["rehearse", str(C128), "--ranks", "512"]) == 2
    assert "outside the world of 512 ranks" in capsys.readouterr().err


def test_index_sizes_are_those_of_the_index_megatron_builds_and_saves(tmp_path):
    """megatron-core's BlendedMegatronDatasetBuilder on real .bin/.idx files: the arrays it
    saves in the index cache are exactly the sizes the rehearsal states."""
    import types

    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder)
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    rng = np.random.default_rng(1)
    for name, docs in (("a", 300), ("b", 500)):
        b = IndexedDatasetBuilder(str(tmp_path / f"{name}.bin"), dtype=np.uint16)
        for _ in range(docs):
            n = int(rng.integers(5, 200))
            b.add_document(rng.integers(0, 4000, size=n), [n])
        b.finalize(str(tmp_path / f"{name}.idx"))
    cfg = load_config(REPO / "configs" / "tiny_cpu.toml", overrides={
        "data": {"data_dir": str(tmp_path), "train_prefixes": ["a", "b"],
                 "train_weights": [0.4, 0.6]}, "run": {"division": "open", "max_steps": 150}})
    plan, _ = dataset.plan(cfg)
    tok = types.SimpleNamespace(eod=0, vocab_size=4096, unique_identifiers={"t": 1})
    gcfg = GPTDatasetConfig(random_seed=1, sequence_length=cfg.model.seq_length,
                            blend_per_split=[([str(tmp_path / "a"), str(tmp_path / "b")],
                                              [0.4, 0.6]), None, None],
                            path_to_cache=str(tmp_path / "cache"), tokenizer=tok,
                            reset_position_ids=False, reset_attention_mask=False,
                            eod_mask_loss=False)
    BlendedMegatronDatasetBuilder(GPTDataset, [plan.samples, None, None], lambda: True,
                                  gcfg).build()
    by_kind: dict[str, list[int]] = {}
    for path in (tmp_path / "cache").glob("*.npy"):
        by_kind.setdefault(path.name.rsplit("-", 1)[-1], []).append(
            np.load(path, mmap_mode="r").nbytes)
    assert sorted(by_kind["document_index.npy"]) == sorted(d.document_index_bytes
                                                          for d in plan.datasets)
    assert sorted(by_kind["sample_index.npy"]) == sorted(d.sample_index_bytes
                                                        for d in plan.datasets)
    assert sorted(by_kind["shuffle_index.npy"]) == sorted(d.shuffle_index_bytes
                                                         for d in plan.datasets)
    assert sum(by_kind["dataset_index.npy"] + by_kind["dataset_sample_index.npy"]) == \
        plan.blend_bytes
    assert max(d.epochs for d in plan.datasets) > 1


def test_run_and_time_rehearses_first_when_asked(tmp_path):
    """REHEARSE=1: the rehearsal runs before the pre-flight and any run, with the same --set
    overrides; without it, no rehearsal."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CONT", "NEXP"))}
    env.update(PYTHONPATH=str(REPO), PYTHON=sys.executable, CONFIG="configs/tiny_cpu.toml",
               DRY_RUN="1", NEXP="1", LOGDIR=str(tmp_path), DATADIR="/d")

    def dry(**extra) -> list[str]:
        p = subprocess.run(["bash", str(REPO / "run_and_time.sh")], cwd=REPO, env={**env, **extra},
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return [ln for ln in p.stderr.splitlines() if ln.startswith("+ ")]

    lines = dry(REHEARSE="1")
    assert lines[0] == "+ py rehearse configs/tiny_cpu.toml --set data.data_dir=/d", lines
    assert not any(ln.startswith("+ py rehearse") for ln in dry())


def test_planner_prediction_for_each_stage():
    """The planner beside a rank: the stage's own parameters (15 layers + embedding on the
    first stage, 16 layers in the middle, 15 + output layer on the last of TP4-PP8-VP8-CP2), BF16
    weights and gradients, 12 optimizer bytes per parameter over DP x CP, NVFP4 copies apart."""
    from llama31_405b.rehearse.planner_view import predict
    cfg = load_config(C2048)
    first, middle, last = predict(cfg, 0), predict(cfg, 3), predict(cfg, 7)
    assert (first.stage, middle.stage, last.stage) == ("first", "middle", "last")
    assert middle.params == pytest.approx(16 * 3_187_703_808 / 4)
    assert first.params == pytest.approx(15 * 3_187_703_808 / 4 + 128_512 * 16_384 / 4)
    for p in (first, middle, last):
        assert p.weights == pytest.approx(2 * p.params) == pytest.approx(p.grads)
        assert p.optimizer == pytest.approx(12 * p.params / (128 * 2))
        assert p.te_copies == pytest.approx(2 * 0.5625 * p.params)
    assert first.activations == middle.activations > 0 and first.capacity == 186e9


def test_planner_memory_of_fp32_parameters():
    """FP32 parameters (the tiny CPU configs) take 4 bytes, their gradient buffers 4, and they
    are their own master weights: Adam adds 8 bytes, not 12 (the rehearsal's measurement of
    Megatron's buffers; the planner used to count 2, and 12)."""
    from llama31_405b.planner.context import Context
    from llama31_405b.planner.memory import memory
    cfg = load_config(REPO / "configs" / "tiny_cpu_2racks.toml")
    assert cfg.precision.params == "fp32"
    ctx = Context.of(cfg)
    m, params = memory(ctx), ctx.params_per_gpu
    shards = ctx.dp * ctx.cp
    assert m.weights_gb == pytest.approx(4 * params / 1e9)
    assert m.grads_gb == pytest.approx(4 * params / 1e9)
    assert m.optimizer_gb == pytest.approx(8 * params / shards / 1e9)
    gb200 = memory(Context.of(load_config(C128)))     # BF16 parameters: unchanged
    p = Context.of(load_config(C128)).params_per_gpu
    assert gb200.grads_gb == pytest.approx(2 * p / 1e9)
    assert gb200.optimizer_gb == pytest.approx(12 * p / 16 / 1e9)
    assert gb200.weights_gb == pytest.approx((2 + 2 * 0.5625) * p / 1e9)


def test_quantized_parameters_take_the_planners_weights():
    """FP8/NVFP4 parameters are TE tensors the local spec builds in BF16: the weight figure is
    not compared, and the total counts the planner's."""
    res = _rank(weights=50e9)
    res["quantized_params"] = "fp8"
    res["planner"]["weights"] = 12e9
    rep = report.verdict(_rep(ranks=[res]))
    assert rep["planner_check"] == [] and rep["ok"]
    assert report.rank_total(res) == pytest.approx((12 + 25 + 9 + 14 + 58 + 12 + 10) * 1e9)
    assert "the total takes the planner's" in "\n".join(report.format_rank(res, 186e9))
