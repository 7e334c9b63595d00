"""The step simulation: Megatron's pass order, the closed-form bubble when communication is
free, exposed DP communication vs microbatches, the extrapolation it uses for long steps, and
the links the topology assigns."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from llama31_405b.planner import fitted, make_config, predict
from llama31_405b.planner.compute import PartTimes
from llama31_405b.planner.context import Context
from llama31_405b.planner.costs import ChunkCost, Plan, plan
from llama31_405b.planner.pipeline import rank_order, schedule_table, warmup_count
from llama31_405b.planner.simulate import _run, run
from llama31_405b.planner.topology import NVLINK, SCALEOUT, dp_cp_span, p2p_link

GB200 = "gb200-nvl72"


@pytest.mark.parametrize("pp,vp,m", [(8, 8, 8), (8, 8, 24), (4, 2, 12), (2, 4, 6), (8, 1, 16), (16, 8, 32)])
def test_pass_order_is_megatrons(pp, vp, m):
    """The table and warm-up counts are megatron-core 0.19.2's own functions' results."""
    from megatron.core.pipeline_parallel import schedules as s
    if vp > 1:
        assert list(schedule_table(m, vp, pp)) == s.get_schedule_table(m, vp, pp)
    for rank in range(pp):
        comm = SimpleNamespace(pp_group=SimpleNamespace(size=lambda: pp, rank=lambda r=rank: r),
                               virtual_pipeline_model_parallel_size=vp if vp > 1 else None)
        total, _, warm, _ = s.get_pp_rank_microbatches(m, vp, pp, p2p_communicator=comm)
        assert warmup_count(pp, vp, m, rank, pp) == warm
        order = rank_order(pp, vp, m, rank)
        assert len(order) == 2 * total
        assert all(f for f, _, _ in order[:warm])
        if warm < total:  # then one forward, one backward (1F1B)
            assert order[warm][0] and not order[warm + 1][0]
        fwd = [(mb, c) for f, mb, c in order if f]
        bwd = [(mb, c) for f, mb, c in order if not f]
        assert sorted(fwd) == sorted(bwd) == sorted((mb, c) for mb in range(m) for c in range(vp))


def uniform_plan(pp: int, vp: int, tf: float = 1.0, tb: float = 2.0) -> Plan:
    """Every pass of every chunk takes tf / tb seconds; no communication at all."""
    zero = PartTimes(0, 0, 0, 0, 0, 0, 0)
    c = ChunkCost(fwd=replace(zero, qkv=tf), bwd=replace(zero, qkv=tb), tp_fwd=0, tp_bwd=0, cp_fwd=0,
                  cp_bwd=0, params=0, reduce_s=0, gather_s=0, buckets=1, first_bucket_share=1.0,
                  last_bucket_share=1.0, first_fwd_s=0, work_fwd=tf,
                  work_bwd=tb)
    return Plan(pp=pp, vp=vp, chunks=tuple(tuple(c for _ in range(vp)) for _ in range(pp)),
                p2p=(0.0,) * pp, sm_share=0, hbm_share=0, nvlink_share=0, overlap_grad=True,
                overlap_param=True, distributed=True, finalize_s=(0.0,) * pp, optimizer_s=0,
                zero_s=0, host_s=0, busy_mb_s=vp * (tf + tb), fwd_mb_s=vp * tf)


@pytest.mark.parametrize("pp,vp,m", [(8, 8, 8), (8, 8, 16), (8, 8, 144), (4, 2, 8), (8, 1, 16),
                                     (16, 8, 32), (4, 4, 12), (2, 2, 4)])
def test_simulation_reproduces_the_closed_form_bubble_without_communication(pp, vp, m):
    s = run(uniform_plan(pp, vp), m)
    busy = m * vp * 3.0
    bubble = (s.step_s - busy) / busy
    assert bubble == pytest.approx((pp - 1) / (vp * m), rel=0.01)
    assert s.bubble_s == pytest.approx(s.step_s - busy)


def test_long_steps_are_extrapolated_exactly():
    fit = fitted()
    for tp, pp, vp, cp in ((4, 8, 8, 2), (4, 8, 1, 2), (4, 4, 4, 4)):
        p = plan(Context.of(make_config(GB200, 8, tp=tp, pp=pp, vp=vp, cp=cp, minibs=pp)), fit)
        m = 6 * pp
        full, fast = _run(p, m), run(p, m)
        assert fast.step_s == pytest.approx(full.step_s, rel=1e-3)
        assert fast.bubble_s + fast.pp_s == pytest.approx(full.bubble_s + full.pp_s, rel=1e-2, abs=1e-3)


def test_step_components_sum_to_the_step():
    for racks, minibs in ((128, 8), (8, 144), (40, 24)):
        p = predict(make_config(GB200, racks, tp=4, pp=8, vp=8, cp=2, minibs=minibs))
        b = p.breakdown
        parts = ("compute_total_s", "tp_s", "cp_s", "pp_s", "bubble_s", "dp_s", "optimizer_s")
        assert sum(b[k] for k in parts) == pytest.approx(p.step_time_s, rel=1e-9)


def test_exposed_dp_communication_rises_as_microbatches_per_step_fall():
    """At about the same GBS, more racks mean fewer microbatches per DP rank: the exposed DP
    time grows (more racks to cross) and so does its share of the step. At a fixed scale the
    exposed time cannot fall as the microbatches fall (Megatron reduces a chunk after its last
    backward, so the windows that hide it do not grow with m), and its share rises."""
    scales = [(8, 144), (16, 72), (32, 32), (64, 16), (128, 8)]
    preds = [predict(make_config(GB200, r, tp=4, pp=8, vp=8, cp=2, minibs=mb)) for r, mb in scales]
    exposed = [p.breakdown["dp_s"] for p in preds]
    share = [p.breakdown["dp_s"] / p.step_time_s for p in preds]
    assert exposed == sorted(exposed) and exposed[-1] > exposed[0] * 1.05
    assert share == sorted(share)
    fixed = [predict(make_config(GB200, 128, tp=4, pp=8, vp=8, cp=2, minibs=mb)) for mb in (32, 16, 8)]
    exposed = [p.breakdown["dp_s"] for p in fixed]
    share = [p.breakdown["dp_s"] / p.step_time_s for p in fixed]
    assert all(b >= a * (1 - 1e-9) for a, b in zip(exposed, exposed[1:]))
    assert share == sorted(share) and share[-1] > 2 * share[0]


def test_dp_overlap_slows_compute_and_vanishes_without_dp():
    one = predict(make_config(GB200, 1, tp=8, pp=8, vp=8, cp=1, minibs=8))  # DP x CP = 1
    assert one.dp == 1 and one.breakdown["dp_unoverlapped_s"] == 0
    assert one.breakdown["dp_slowdown_s"] == pytest.approx(0, abs=1e-9)
    many = predict(make_config(GB200, 128, tp=4, pp=8, vp=8, cp=2, minibs=8))
    assert many.breakdown["dp_slowdown_s"] > 0 and many.breakdown["dp_s"] > 0


def test_links_come_from_the_topology():
    gb200 = Context.of(make_config(GB200, 128, tp=4, pp=8, vp=8, cp=2, minibs=8))
    assert all(p2p_link(gb200, r) == NVLINK for r in range(8))
    sp = dp_cp_span(gb200)
    assert (sp.inside, sp.across) == (2, 128)  # the CP pair inside a rack, DP across racks
    h100 = Context.of(make_config("h100-sxm", 16, tp=4, pp=4, vp=1, cp=1, minibs=8))
    # 8-GPU nodes: a 4-stage pipeline of TP4 spans two nodes; the hop between them is scale-out
    assert [p2p_link(h100, r) for r in range(4)] == [NVLINK, SCALEOUT, NVLINK, SCALEOUT]
    slow = plan(h100, fitted()).p2p
    assert slow[1] > 3 * slow[0]


def test_the_optimizers_parameter_gather_is_exposed_dp_as_a_profile_counts_it(tmp_path):
    """Distributed optimizer without the overlapped parameter gather (the tiny CPU config at
    DP2): the all-gather after the optimizer is exposed DP time in the breakdown, as a profile
    counts it (the DP group's collectives), not end-of-step work; the step is unchanged."""
    from llama31_405b.config.load import load_config
    from llama31_405b.planner.step import breakdown
    from test_planner_core_share import config
    cfg = load_config(config(tmp_path, "dp2", 2, 1, 1, 2))
    assert cfg.optimizer.distributed and not cfg.performance.overlap_param_gather
    ctx, fit = Context.of(cfg), fitted()
    p, b = plan(ctx, fit), breakdown(ctx, fit)
    gather = sum(c.gather_s for c in p.chunks[0])
    sim = run(p, ctx.microbatches, {}, rank=0)
    assert gather > 0
    assert b.dp_exposed_s == pytest.approx(sim.dp_wait_s + sim.dp_drain_s + gather)
    assert b.optimizer_s == pytest.approx(sim.finalize_s + sim.optimizer_s - gather)
    assert b.step_s == pytest.approx(sim.step_s)
