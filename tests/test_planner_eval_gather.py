"""The planner counts the evaluation's parameter all-gather, the part its forward passes do not
hide (planner.step.eval_gather_exposed_s; train.evaluation.GatherAhead dispatches each chunk's
gather ahead of its forward passes)."""
import math
from pathlib import Path

from llama31_405b.config import load_config
from llama31_405b.planner import fitted, step
from llama31_405b.planner.context import Context
from llama31_405b.planner.costs import plan
from llama31_405b.planner.spec import make_config

REPO = Path(__file__).resolve().parents[1]
GB200_8_RACKS = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"


def _ctx():
    return Context.of(load_config(GB200_8_RACKS)), fitted()


def test_the_evaluation_time_includes_the_exposed_gather():
    ctx, fit = _ctx()
    p = plan(ctx, fit)
    n_mb = math.ceil(5760 / ctx.dp)
    exposed = step.eval_gather_exposed_s(ctx, fit, n_mb, p.fwd_mb_s)
    first = p.chunks[0][0]
    # with 720 microbatches per replica every later chunk's gather hides behind the forwards:
    # only chunk 0's first bucket used is waited for (its layout's last, the embedding's), a
    # sliver of the whole gather
    assert exposed == first.gather_s * first.last_bucket_share
    assert 0 < exposed < sum(c.gather_s for c in p.chunks[0]) / 10
    fill = (ctx.pp - 1) / ctx.vp
    assert step.eval_time_s(ctx, fit, 5760) == (n_mb + fill) * p.fwd_mb_s + exposed


def test_a_gather_longer_than_the_forwards_before_its_chunk_is_exposed():
    ctx, fit = _ctx()
    p = plan(ctx, fit)
    first = p.chunks[0][0]
    # one microbatch: chunk i-1 runs one forward (1/VP of a microbatch) before chunk i starts
    per_chunk = p.fwd_mb_s / len(p.chunks[0])
    hidden_at_most = first.gather_s * first.last_bucket_share + per_chunk * (len(p.chunks[0]) - 1)
    exposed = step.eval_gather_exposed_s(ctx, fit, 1, p.fwd_mb_s)
    gathers = sum(c.gather_s for c in p.chunks[0])
    assert exposed >= gathers - hidden_at_most - 1e-12
    assert exposed <= gathers + 1e-12


def test_at_vp1_the_chain_hides_all_but_the_first_bucket():
    fit = fitted()
    one = Context.of(make_config("gb200-nvl72", 8, tp=4, pp=8, vp=1, cp=2, minibs=144))
    p = plan(one, fit)
    first = p.chunks[0][0]
    assert len(p.chunks[0]) == 1
    assert (step.eval_gather_exposed_s(one, fit, 8, p.fwd_mb_s)
            == first.gather_s * first.last_bucket_share)
