"""First contact's layer phase, FP8 beside BF16 (first_contact/gemm.py, layer.py): the TP4
shard's GEMM shapes and the peaks come from the planner and the system file, the FP8 product
(torch._scaled_mm, E4M3, per-tensor scales; it runs on the CPU too) is the BF16 product within
E4M3's precision and a wrong scale fails the check, the FLOP count and the report fields, and
every row is in the JSON report as soon as it is measured. CPU, tiny shapes: no timing asserted."""
import json

import pytest

import torch  # noqa: E402  (a pinned dependency: its absence fails, never skips)

from llama31_405b.planner import compute  # noqa: E402
from llama31_405b.planner.calibrate import fitted  # noqa: E402
from llama31_405b.systems import load_system  # noqa: E402
from llama31_405b.first_contact import Report  # noqa: E402
from llama31_405b.first_contact import gemm, layer  # noqa: E402

TP4_SHARD = {"qkv": [4096, 4608, 16384], "proj": [4096, 16384, 4096],
             "ffn_up": [4096, 26624, 16384], "ffn_down": [4096, 16384, 13312]}
"""(M tokens, N outputs, K inputs) of one GPU of the HGX H200 layout (TP4, CP2, MBS 1)."""


@pytest.mark.parametrize("prec", ["bf16", "fp8"])
def test_the_shapes_and_peaks_are_the_planners(prec):
    a = gemm.planner_assumption("h200-sxm", prec)
    assert a["tokens"] == 4096
    assert {k: v["mnk"] for k, v in a["linears"].items()} == TP4_SHARD
    assert a["peak_tflops"] == load_system("h200-sxm").peak_tflops(prec) == {
        "bf16": 989.4, "fp8": 1978.9}[prec]
    assert a["peak_fraction"] == compute.gemm_peak_fraction(prec, fitted())
    ctx = gemm.planner_context("h200-sxm", prec)
    rates = compute.part_rates(ctx, fitted())
    for k, (M, N, K) in TP4_SHARD.items():
        row = {"flops": 6.0 * M * N * K, "seconds": 1e-3, "tflops": 6.0 * M * N * K / 1e-3 / 1e12}
        f = gemm.against_planner(row, a, k)
        assert f["planner_tflops"] == pytest.approx(rates[k])       # the planner's own rate
        assert f["share_of_peak"] == pytest.approx(row["tflops"] / a["peak_tflops"])
        assert f["measured_over_planner"] == pytest.approx(
            sum(a["linears"][k]["passes_s"].values()) / 1e-3)
    n = gemm.CEILING_N
    assert a["ceiling_s"] == compute.gemm_passes(ctx, n, n, n, fitted())[0]


def test_pass_shapes_and_flops():
    assert gemm.pass_shapes(4096, 26624, 16384) == {
        "fwd": (4096, 26624, 16384), "dgrad": (4096, 16384, 26624), "wgrad": (26624, 16384, 4096)}
    assert sum(gemm.gemm_flops(*s) for s in gemm.pass_shapes(5, 7, 11).values()) == 6 * 5 * 7 * 11


def test_the_fp8_product_is_the_bf16_one_within_e4m3_precision():
    (qa, sa), (qb, sb) = gemm.operands(48, 32, 64, "fp8", device="cpu", seed=1)
    assert qa.dtype == qb.dtype == torch.float8_e4m3fn and sa.dim() == 0
    assert float(qa.float().abs().max()) == gemm.E4M3_MAX                # amax -> 448
    a, b = gemm.operands(48, 32, 64, "bf16", device="cpu", seed=1)
    deq = qa.float() * sa                                                 # the operand back
    assert float((deq - a.float()).abs().max() / a.float().abs().max()) < 2 ** -4
    y = gemm.product((qa, sa), (qb, sb), "fp8", fast_accum=False)
    assert y.dtype == torch.bfloat16 and y.shape == (48, 32)
    err = gemm.rel_error_vs_bf16((qa, sa), (qb, sb), 48, 32, 64, device="cpu", seed=1)
    assert 0 < err < layer.FP8_MAX_REL_ERROR
    ref = a.float() @ b.float().t()
    assert float((y.float() - ref).norm() / ref.norm()) == pytest.approx(err, rel=0.05)


def _cpu_ceiling(prec):
    return gemm.ceiling(prec, n=64, iters=2, warmup=1, device="cpu")


def _tiny(assumed):
    """The planner's assumption with each shape divided by 256 (its times unchanged)."""
    return {p: dict(a, linears={k: dict(v, mnk=[d // 256 for d in v["mnk"]])
                                for k, v in a["linears"].items()}) for p, a in assumed.items()}


def test_the_layer_phase_gemm_checks_on_the_cpu(tmp_path):
    path = tmp_path / "layer.json"
    rep = Report(path=path)
    assumed = {p: gemm.planner_assumption("h200-sxm", p) for p in ("bf16", "fp8")}
    for name, prec in layer.CEILINGS.items():
        layer.ceiling_check(rep, name, prec, assumed[prec], system="h200-sxm",
                            ceiling_fn=_cpu_ceiling)
    doc = {c["name"]: c for c in json.loads(path.read_text())["checks"]}
    fp8 = doc["matmul_ceiling_fp8"]
    assert fp8["status"] == "passed" and "FP8 64^3 matrix product" in fp8["detail"]
    assert fp8["data"]["datasheet_tflops"] == 1978.9
    assert fp8["data"]["planner_tflops"] == pytest.approx(
        2 * 8192 ** 3 / assumed["fp8"]["ceiling_s"] / 1e12)
    assert fp8["data"]["share_of_peak"] == pytest.approx(fp8["data"]["tflops"] / 1978.9)
    assert 0 < fp8["data"]["rel_error_vs_bf16"] < layer.FP8_MAX_REL_ERROR
    assert doc["matmul_ceiling"]["data"]["datasheet_tflops"] == 989.4

    seen = []

    def shard_fn(shapes, **kw):
        on_row = kw.pop("on_row")

        def check_written(name, prec, row):
            on_row(name, prec, row)
            doc = {c["name"]: c for c in json.loads(path.read_text())["checks"]}
            data = doc["gemms_tp4"]["data"]
            seen.append((name, prec))
            assert sum(len(data.get(k, {})) for k in TP4_SHARD) == len(seen)   # written at once
        small = {k: [d // 256 for d in v] for k, v in shapes.items()}
        return gemm.shard_gemms(small, iters=1, warmup=0, device="cpu", on_row=check_written, **kw)

    layer.gemms_check(rep, assumed, shard_fn=shard_fn)
    assert seen == [(k, p) for k in TP4_SHARD for p in ("bf16", "fp8")]
    c = {c["name"]: c for c in json.loads(path.read_text())["checks"]}["gemms_tp4"]
    assert c["status"] == "passed", c["detail"]
    assert c["data"]["tokens"] == 4096 and c["data"]["dense_peak_tflops"] == {"bf16": 989.4,
                                                                              "fp8": 1978.9}
    row = c["data"]["ffn_up"]["fp8"]
    assert row["mnk"] == [16, 104, 64] and row["flops"] == 6.0 * 16 * 104 * 64
    assert set(row["passes_s"]) == {"fwd", "dgrad", "wgrad"}
    assert row["seconds"] == pytest.approx(sum(row["passes_s"].values()))
    assert row["tflops"] == pytest.approx(row["flops"] / row["seconds"] / 1e12)
    assert {"share_of_peak", "planner_tflops", "measured_over_planner",
            "rel_error_vs_bf16"} <= set(row)
    assert "rel_error_vs_bf16" not in c["data"]["ffn_up"]["bf16"]
    assert "ffn_up 16x104x64: BF16" in c["detail"] and "4096 tokens" in c["detail"]


def test_a_wrong_fp8_scale_fails_the_checks(tmp_path, monkeypatch):
    """The scale handed to torch._scaled_mm is the dequantization one; the quantization scale
    in its place is off by 448^2 / amax^2 and both FP8 checks fail."""
    good = gemm.quantize_e4m3

    def inverted(t):
        q, s = good(t)
        return q, 1.0 / s
    monkeypatch.setattr(gemm, "quantize_e4m3", inverted)
    rep = Report(path=tmp_path / "r.json")
    assumed = {p: gemm.planner_assumption("h200-sxm", p) for p in ("bf16", "fp8")}
    layer.ceiling_check(rep, "matmul_ceiling_fp8", "fp8", assumed["fp8"], system="h200-sxm",
                        ceiling_fn=_cpu_ceiling)
    assert rep.checks["matmul_ceiling_fp8"].status == "failed"
    assert "expected < 0.1" in rep.checks["matmul_ceiling_fp8"].detail
    layer.gemms_check(rep, _tiny(assumed), shard_fn=lambda s, **kw: gemm.shard_gemms(
        s, iters=1, warmup=0, device="cpu", **kw))
    assert rep.checks["gemms_tp4"].status == "failed"
    assert "FP8 error vs BF16 over 0.1 at qkv, proj, ffn_up, ffn_down" in rep.checks[
        "gemms_tp4"].detail


def test_without_a_passed_fp8_ceiling_only_bf16_is_timed(tmp_path):
    rep = Report(path=tmp_path / "r.json")
    assumed = _tiny({"bf16": gemm.planner_assumption("h200-sxm", "bf16")})
    layer.gemms_check(rep, assumed, precisions=("bf16",), shard_fn=lambda s, **kw:
                      gemm.shard_gemms(s, iters=1, warmup=0, device="cpu", **kw))
    c = rep.checks["gemms_tp4"]
    assert c.status == "passed" and "FP8 not timed" in c.detail
    assert all(set(c.data[k]) == {"bf16"} for k in TP4_SHARD)


def test_the_bench_reads_the_planner_in_both_precisions():
    """bench/gpu_layer.py's planner rates per precision: the planner's own part rates of the
    HGX H200 layout, FP8 GEMMs predicted faster than BF16 ones."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "gpu_layer", Path(__file__).resolve().parents[1] / "bench" / "gpu_layer.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bf16, _ = bench.planner_rates("h200-sxm")
    fp8, _ = bench.planner_rates("h200-sxm", "fp8")
    assert fp8 == compute.part_rates(gemm.planner_context("h200-sxm", "fp8"), fitted())
    assert all(fp8[k] > bf16[k] for k in TP4_SHARD)
