"""config.rcp, the config's own RCP lookup (no numpy/scipy at config load), against
mlperf_logging's RCP_Checker (through submission.rcp.reference), and the max_steps rule."""
import pytest

from llama31_405b.config import rcp
from llama31_405b.submission.rcp import make_checker, reference


@pytest.mark.parametrize("benchmark,gbss", [("llama31_405b", range(8, 4609, 8)),
                                            ("tiny_llama31", range(1, 65))])
def test_rcp_mean_is_the_checkers_at_every_gbs(benchmark, gbss):
    ck = make_checker(benchmark)
    for gbs in gbss:
        mine, theirs = rcp.rcp_mean(benchmark, gbs), reference(benchmark, gbs, checker=ck)
        if theirs.kind == "missing":     # above every RCP: the checker fails the run
            assert mine.kind == "above"
            continue
        assert mine.kind == theirs.kind, gbs
        assert mine.mean == pytest.approx(theirs.mean, rel=1e-12, abs=1e-6), gbs


def test_rcp_files():
    assert rcp.rcp_file_for("tiny_llama31") == rcp.TINY_RCP_FILE
    f = rcp.rcp_file_for("llama31_405b")
    assert f.is_file() and f.parts[-2:] == ("training_6.0.0", "rcps_llama31_405b.json")
    assert rcp.shown(f) == "mlperf_logging/rcp_checker/training_6.0.0/rcps_llama31_405b.json"
    assert rcp.shown(rcp.TINY_RCP_FILE) == "compliance/tiny_llama31_rcps.json"


def test_max_steps_rule():
    """The largest multiple of 50 steps within 2 x the RCP mean: 500 at GBS 1152 (the proven
    cap), and every GB200 scale (GBS 896..1536) at most 1000."""
    want = {896: 650, 960: 650, 1024: 600, 1152: 500, 1280: 450, 1536: 400}
    assert {g: rcp.max_steps_for("llama31_405b", g) for g in want} == want
    assert rcp.max_steps_for("tiny_llama31", 8) == 350
    for g in range(640, 4609, 8):
        steps = rcp.max_steps_for("llama31_405b", g)
        assert steps <= 1000 and steps % 50 == 0
        assert steps * g <= 2 * rcp.rcp_mean("llama31_405b", g).mean < (steps + 50) * g


@pytest.mark.parametrize("benchmark", ["llama31_405b", "tiny_llama31"])
def test_pruned_stats_are_the_checkers(benchmark):
    """The planner's RCP means and spreads (config.rcp.pruned_stats, no numpy) are the checker's
    pruned 'RCP Mean' and 'RCP Stdev'."""
    ck = make_checker(benchmark)
    theirs = sorted((int(r["BS"]), float(r["RCP Mean"]), float(r["RCP Stdev"]))
                    for r in ck.pruned_rcp_data.values())
    mine = rcp.pruned_stats(rcp.rcp_file_for(benchmark))
    assert [bs for bs, _, _ in mine] == [bs for bs, _, _ in theirs]
    for (_, m1, s1), (_, m2, s2) in zip(mine, theirs):
        assert m1 == pytest.approx(m2, rel=1e-12) and s1 == pytest.approx(s2, rel=1e-9)
