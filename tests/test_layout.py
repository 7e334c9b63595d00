"""Rank groups by order string, checked against megatron-core's RankGenerator at cluster scale."""
import pytest
from megatron.core.parallel_state import RankGenerator

from llama31_405b.parallel.layout import Layout


@pytest.mark.parametrize("tp,cp,pp,dp", [(4, 2, 8, 128), (2, 2, 8, 16), (1, 1, 2, 2), (4, 1, 1, 3)])
def test_groups_match_megatron(tp, cp, pp, dp):
    lay = Layout(tp=tp, cp=cp, pp=pp, dp=dp)
    gen = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-pp-dp")
    for kind in ("tp", "cp", "pp", "dp", "tp-cp-pp", "tp-pp"):
        assert lay.groups(kind) == sorted(sorted(g) for g in gen.get_ranks(kind)), kind


def test_model_parallel_group_is_one_rack():
    lay = Layout(tp=4, cp=2, pp=8, dp=128)
    for g in lay.groups("tp-cp-pp"):
        assert g == list(range(g[0], g[0] + 64)) and g[0] % 64 == 0


def test_coords_roundtrip():
    lay = Layout(tp=4, cp=2, pp=8, dp=4)
    for r in range(lay.world_size):
        assert lay.rank(lay.coords(r)) == r
        assert r in lay.group_of("dp", r)
