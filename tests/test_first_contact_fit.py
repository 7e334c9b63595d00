"""first-contact refuses, before building, a slice that cannot fit the memory it would run in
(llama31_405b/first_contact/fit.py): `first-contact --cpu` on the default GB200 config (a
one-layer slice of 7.39 B parameters with the 128,256-row vocabulary) was killed by the kernel's
out-of-memory killer after about 24 GB, with no message. Nothing here builds a model: the
estimate is checked against its parts, and the refusal with an injected available figure."""
from __future__ import annotations

import argparse
import dataclasses
import os

import pytest

from conftest import REPO
from llama31_405b.config import load_config
from llama31_405b.config.derived import padded_vocab, param_count
from llama31_405b import first_contact as fc
from llama31_405b.first_contact import checks, dp2, fit

GIB = 2**30
TINY_CONFIGS = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("tiny_cpu*.toml"))


def _slice(config, *, cpu: bool, te: bool = False, layers: int = 1, seq: int | None = None):
    cfg = load_config(config, validate=False)
    return fit.slice_estimate(cfg, te=te, cpu=cpu, cap=None if cpu else (9, 0), layers=layers,
                              seq_length=seq, steps=3, system="cpu" if cpu else "h200-sxm")


def test_the_estimate_of_the_default_cpu_slice():
    """Parameters x (BF16 weight + BF16 gradient + FP32 master + two FP32 Adam moments), the
    planner's model; the local attention's scores; the host copies."""
    est = _slice(fc.DEFAULT_CONFIG, cpu=True)
    cfg = load_config(fc.DEFAULT_CONFIG, validate=False)
    m = cfg.model
    one_layer = dataclasses.replace(m, num_layers=1)
    assert est.parameters == param_count(one_layer, padded_vocab(one_layer, 1))
    assert round(est.parameters / 1e9, 2) == 7.39 and m.vocab_size == 128256
    assert est.state == pytest.approx(est.parameters * (2 + 2 + 4 + 8))
    scores = m.num_attention_heads * fc.LOCAL_SEQ_LENGTH ** 2 * fit.LOCAL_SCORE_BYTES
    assert scores < est.activations < 3 * scores
    assert est.host_copies == pytest.approx(est.parameters * (4 + 2 * 2))   # masters, 2 copies
    assert est.reserve == fit.PROCESS_BYTES and not est.gpu
    assert est.needs() == {"host": est.device + est.host_copies}
    assert est.needs()["host"] > 150 * GIB        # the process was killed at about 24 GB
    assert est.needs(ranks=2)["host"] == 2 * est.needs()["host"]          # dp2: one host


def test_the_h200_slice_fits_one_h200_and_a_second_layer_does_not():
    """The package docstring's claim, in the estimate: one layer (4.26 B parameters, 64 GiB of
    training state) fits one H200's 139 GiB with the graph pool and an eager pass; two do not."""
    one = _slice(fc.DEFAULT_CONFIG, cpu=False, seq=fc.LOCAL_SEQ_LENGTH)
    two = _slice(fc.DEFAULT_CONFIG, cpu=False, seq=fc.LOCAL_SEQ_LENGTH, layers=2)
    with_te = _slice(fc.DEFAULT_CONFIG, cpu=False, te=True)          # FP8 at 8,192 on an H200
    assert round(one.parameters / 1e9, 2) == 4.26
    assert 60 * GIB < one.state < 66 * GIB
    assert one.needs()["gpu"] < 100 * GIB < 139 * GIB < two.needs()["gpu"]
    assert with_te.state > one.state and with_te.needs()["gpu"] < 120 * GIB   # FP8 copies
    assert one.needs()["host"] == one.host_copies                    # the GPU's state is not


def test_a_slice_that_cannot_fit_is_refused_naming_the_estimate_and_the_configs_that_fit(
        monkeypatch, capsys):
    """`first-contact --cpu` with its defaults on a host with 24 GiB available: the slice and
    the DP 2 phase fail before anything is built; the detail names the estimate, the memory
    available and the configs that fit (the tiny ones: computed from configs/)."""
    monkeypatch.setattr(os, "environ", dict(os.environ))     # run_checks exports launch_env
    monkeypatch.setattr(fit, "host_available", lambda: 24 * GIB)

    def must_not_build(*a, **k):
        pytest.fail("the slice was built although it cannot fit")
    monkeypatch.setattr(checks, "_run_slice", must_not_build)
    monkeypatch.setattr(dp2, "run_dp2_phase", must_not_build)
    p = argparse.ArgumentParser()
    fc.add_arguments(p)
    assert fc.run(p.parse_args(["--cpu"])) == 1
    out, err = capsys.readouterr()
    assert "2 failed" in err
    est = _slice(fc.DEFAULT_CONFIG, cpu=True)
    rep = fc.run_checks(cpu=True)
    build = rep.checks["build"]
    assert build.status == "failed"
    assert build.detail.startswith(
        f"refused before building: the slice needs about {est.needs()['host'] / GIB:.1f} GiB of "
        f"host memory, 24.0 GiB available (7.39 B parameters: training state ")
    assert build.detail.endswith("configs that fit: " + ", ".join(TINY_CONFIGS))
    assert build.data["fitting_configs"] == TINY_CONFIGS
    assert build.data["memory_available_gib"] == {"host": 24.0}
    assert {rep.checks[n].detail for n in fc.PHASES["slice"][1:]} == {"needs the build check"}
    d = rep.checks["dp2_eval_sync"]
    assert d.status == "failed" and "the DP 2 phase needs about" in d.detail
    assert "2 ranks on this host, each 7.39 B parameters" in d.detail


def test_a_slice_that_fits_records_its_estimate(monkeypatch):
    """With enough memory nothing is refused; the build check's figures hold the estimate (on a
    GPU: beside the allocator's peak, what a first run calibrates it against)."""
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.setattr(fit, "host_available", lambda: 1024 * GIB)
    built = []
    monkeypatch.setattr(checks, "_run_slice", lambda rep, scfg, tmp, *, te: built.append(scfg))
    rep = fc.run_checks(cpu=True, phases=("slice",))
    assert len(built) == 1 and rep.failures == 0
    assert rep.checks["build"].data["memory_available_gib"] == {"host": 1024.0}
    assert rep.checks["build"].data["memory_estimate_gib"]["host"] > 150


def test_no_config_fits_a_tiny_memory():
    est = _slice(REPO / "configs" / "tiny_cpu.toml", cpu=True)
    have = {"host": GIB}                               # under the process allowance alone
    assert fit.shortfalls(est, have) == {"host": (est.needs()["host"], GIB)}
    of = lambda c: fit.slice_estimate(c, te=False, cpu=True, cap=None, layers=1,  # noqa: E731
                                      seq_length=None, steps=3, system="cpu")
    assert fit.fitting_configs(of, have) == []
    assert fit.refusal("the slice", est, have, []).endswith("configs that fit: none")
    assert fit.fitting_configs(of, {"host": 3 * GIB}) == TINY_CONFIGS


def test_available_host_memory_is_lowered_to_a_cgroup_limit(monkeypatch, tmp_path):
    meminfo = {line.split(":")[0]: int(line.split()[1]) * 1024
               for line in open("/proc/meminfo") if line.split(":")[0] in ("MemAvailable",
                                                                          "MemTotal")}
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    monkeypatch.setattr(fit, "CGROUP_FILES", ((str(limit), str(usage)),))
    limit.write_text("max\n")
    usage.write_text(f"{GIB}\n")
    assert 0 < fit.host_available() <= meminfo["MemTotal"]        # no limit: MemAvailable
    limit.write_text(f"{2 * GIB}\n")
    assert fit.host_available() == GIB                               # limit less usage
    usage.write_text(f"{3 * GIB}\n")
    assert fit.host_available() == 0
