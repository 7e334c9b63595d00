"""The MLPerf header of a config: the cap and the samples it requests, and the precision keys."""
import dataclasses
import json
from pathlib import Path

from llama31_405b.config import load_config
from llama31_405b.mlperf.header import comm_precisions, header_events, lowest_precisions
from mlperf_logs import LOGS, need_fixture

REPO = Path(__file__).resolve().parents[1]
GB200 = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"
TINY = REPO / "configs" / "tiny_cpu.toml"


def _header(cfg) -> dict:
    return {e.key: e.value for e in header_events(cfg, seed=1)}


def test_max_steps_logs_the_cap_and_train_samples_what_the_run_requests():
    cfg = load_config(GB200)
    h = _header(cfg)
    assert h["max_steps"] == cfg.run.max_steps == 500
    assert h["train_samples"] == 500 * 1152
    # the LR schedule is the rules' whatever the cap
    assert (h["opt_learning_rate_warmup_steps"], h["opt_learning_rate_decay_steps"]) == (
        cfg.derived.warmup_steps, cfg.derived.decay_steps)


def test_the_reference_logs_train_samples_as_a_constant():
    """The published logs: the same train_samples in runs capped at 500 and 1000 steps, so it is
    not max_steps x GBS (docs/compliance.md: its meaning is unverified)."""
    need_fixture()
    seen = set()
    for path in LOGS:
        ev = {}
        for line in path.read_text().splitlines():
            if ":::MLLOG" in line:
                rec = json.loads(line.split(":::MLLOG", 1)[1])
                ev.setdefault(rec["key"], rec["value"])
        seen.add((ev["train_samples"], ev["max_steps"], ev["global_batch_size"]))
    assert {s[0] for s in seen} == {1574207408} and {s[1] for s in seen} == {500, 1000}


def _with(cfg, **sections):
    return dataclasses.replace(cfg, **{k: dataclasses.replace(getattr(cfg, k), **v)
                                       for k, v in sections.items()})


def test_comm_precision_follows_what_is_communicated():
    gb = load_config(GB200)
    c = comm_precisions(gb)
    assert c["gradient reduction"] == "bf16" and c["parameter all-gather"] == "bf16"
    # TE gathers the sequence-parallel GEMM inputs quantized: NVFP4 on the wire
    assert c["sequence-parallel GEMM input all-gather"] == "nvfp4"
    assert lowest_precisions(gb)["lowest_numerical_precision_in_comm"] == "nvfp4"
    no_sp = _with(gb, parallel={"sequence_parallel": False})
    assert lowest_precisions(no_sp)["lowest_numerical_precision_in_comm"] == "bfloat16"
    fp32_grads = _with(no_sp, precision={"grad_reduce_in_fp32": True})
    assert comm_precisions(fp32_grads)["gradient reduction"] == "fp32"
    assert lowest_precisions(fp32_grads)["lowest_numerical_precision_in_comm"] == "bfloat16"
    fp4_gather = _with(no_sp, performance={"fp4_param_gather": True})
    assert lowest_precisions(fp4_gather)["lowest_numerical_precision_in_comm"] == "nvfp4"
    tiny = load_config(TINY)
    assert lowest_precisions(tiny)["lowest_numerical_precision_in_comm"] == "fp32"
    bf16_grads = _with(tiny, precision={"params": "bf16", "grad_reduce_in_fp32": False})
    assert comm_precisions(bf16_grads)["gradient reduction"] == "bf16"
    assert lowest_precisions(bf16_grads)["lowest_numerical_precision_in_comm"] == "bfloat16"
