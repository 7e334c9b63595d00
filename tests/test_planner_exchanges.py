"""The pipeline's blocking exchanges (planner pipeline.rank_program, simulate.py): the calls
megatron-core 0.19.2's own schedules make, recorded by running them with a recording
communicator and no model; and what the simulation makes of them."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from llama31_405b.planner.pipeline import Exchange, rank_order, rank_program
from llama31_405b.planner.simulate import _run
from test_planner_simulation import uniform_plan

LAYOUTS = [(2, 1, 4), (4, 1, 8), (4, 1, 2), (2, 1, 1), (2, 2, 4), (2, 2, 2), (4, 2, 8), (4, 4, 4),
           (2, 4, 6), (8, 8, 16), (4, 2, 12), (4, 2, 4)]


class _Config:
    """The TransformerConfig fields the schedules read; every other one reads None (off)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __getattr__(self, name):
        return None


class _Recorder:
    """A P2PCommunicator that records each call as an Exchange (the real one's rules for what
    it sends and receives) and hands back zero tensors for what it receives."""

    def __init__(self, pp: int, rank: int, vp: int, config: _Config, log: list):
        self.pp_group = SimpleNamespace(size=lambda: pp, rank=lambda: rank)
        self.config, self.log = config, log
        self.virtual_pipeline_model_parallel_size = vp if vp > 1 else None
        self.is_pp_first_stage, self.is_pp_last_stage = rank == 0, rank == pp - 1
        self.total_stages, self.current_stage = pp, rank

    def _x(self, send_next=None, send_prev=None, recv_prev=False, recv_next=False):
        self.log.append(Exchange(send_next=send_next is not None, send_prev=send_prev is not None,
                                 recv_prev=bool(recv_prev), recv_next=bool(recv_next)))
        return torch.zeros(1)

    def recv_forward(self, shape, is_first_stage):
        return None if is_first_stage else self._x(recv_prev=True)

    def recv_backward(self, shape, is_last_stage):
        return None if is_last_stage else self._x(recv_next=True)

    def send_forward(self, out, is_last_stage):
        if not is_last_stage:
            self._x(send_next=out)

    def send_backward(self, grad, is_first_stage):
        if not is_first_stage:
            self._x(send_prev=grad)

    def send_forward_recv_backward(self, out, shape, is_last_stage):
        return None if is_last_stage else self._x(send_next=out, recv_next=True)

    def send_backward_recv_forward(self, grad, shape, is_first_stage):
        return None if is_first_stage else self._x(send_prev=grad, recv_prev=True)

    def send_forward_recv_forward(self, out, recv_prev, tensor_shape, overlap_p2p_comm=False):
        return self._x(send_next=out, recv_prev=recv_prev)

    def send_backward_recv_backward(self, grad, recv_next, tensor_shape, overlap_p2p_comm=False):
        return self._x(send_prev=grad, recv_next=recv_next)

    def send_forward_backward_recv_forward_backward(self, out, grad, recv_prev, recv_next,
                                                    tensor_shape):
        return self._x(send_next=out, send_prev=grad, recv_prev=recv_prev,
                       recv_next=recv_next), torch.zeros(1)


def megatron_program(pp: int, vp: int, m: int, rank: int, monkeypatch) -> list:
    """Passes ((forward?, microbatch, chunk)) and exchanges in the order megatron-core's schedule
    makes them on pipeline rank `rank`, without overlap_p2p_comm or batch_p2p_comm (the CPU
    builder's settings)."""
    from llama31_405b import cpu_compat
    from llama31_405b.systems.device import CPU
    cpu_compat.apply(CPU)
    from megatron.core.pipeline_parallel import schedules as s
    from megatron.core.process_groups_config import ProcessGroupCollection
    cfg = _Config(microbatch_group_size_per_vp_stage=pp, hidden_size=8, sequence_parallel=False,
                  virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
                  overlap_p2p_comm=False, batch_p2p_comm=False, deallocate_pipeline_outputs=False,
                  overlap_p2p_comm_warmup_flush=False, overlap_moe_expert_parallel_comm=False,
                  variable_seq_lengths=False, calculate_per_token_loss=True)
    log: list = []
    models = [torch.nn.Linear(1, 1) for _ in range(vp)]
    for mod in models:
        mod.config, mod.model_type = cfg, None

    def forward(func, it, model, n, inp, store, config, *a, current_microbatch=None,
                vp_stage=None, **kw):
        log.append((True, current_microbatch, vp_stage or 0))
        return torch.tensor([float(current_microbatch * 100 + (vp_stage or 0))]), torch.tensor(1)

    def backward(inp, out, grad, config, *a, **kw):
        v = int(out.item())
        log.append((False, v // 100, v % 100))
        return torch.zeros(1)

    monkeypatch.setattr(s, "forward_step", forward)
    monkeypatch.setattr(s, "backward_step", backward)
    # without torch.distributed, megatron's get_pg_rank answers 0 for every group
    monkeypatch.setattr(s, "is_pp_first_stage", lambda g: g.rank() == 0)
    monkeypatch.setattr(s, "is_pp_last_stage", lambda g: g.rank() == g.size() - 1)
    pg = ProcessGroupCollection()
    pg.tp = pg.cp = SimpleNamespace(size=lambda: 1)
    comm = _Recorder(pp, rank, vp, cfg, log)
    if vp > 1:
        s.forward_backward_pipelining_with_interleaving(
            forward_step_func=None, data_iterator=[None] * vp, model=models, num_microbatches=m,
            seq_length=4, micro_batch_size=1, p2p_communicator=comm, pg_collection=pg)
    else:
        s.forward_backward_pipelining_without_interleaving(
            forward_step_func=None, data_iterator=None, model=models[0], num_microbatches=m,
            seq_length=4, micro_batch_size=1, p2p_communicator=comm, pg_collection=pg)
    return [e for e in log if not (isinstance(e, Exchange) and not any(e))]


@pytest.mark.parametrize("pp,vp,m", LAYOUTS)
def test_program_is_the_one_megatron_runs(pp, vp, m, monkeypatch):
    for rank in range(pp):
        got = list(rank_program(pp, vp, m, rank))
        assert got == megatron_program(pp, vp, m, rank, monkeypatch), (pp, vp, m, rank)
        assert [op for op in got if not isinstance(op, Exchange)] == list(rank_order(pp, vp, m, rank))


@pytest.mark.parametrize("pp,vp,m", LAYOUTS)
def test_every_send_has_its_receive(pp, vp, m):
    """Per channel (activations r -> r+1, gradients r -> r-1), as many sends as receives."""
    count: dict[tuple, int] = {}
    for r in range(pp):
        for x in rank_program(pp, vp, m, r):
            if isinstance(x, Exchange):
                for key, on in ((("f", r), x.send_next), (("b", r), x.send_prev),
                                (("f", (r - 1) % pp), -x.recv_prev), (("b", (r + 1) % pp), -x.recv_next)):
                    count[key] = count.get(key, 0) + int(on)
    assert all(v == 0 for v in count.values()), count


def test_a_chain_waits_for_each_rendezvous():
    """PP2, one microbatch, sends of h seconds: rank 0's forward (1 s), the send, rank 1's
    forward (1) and backward (2), the send back, rank 0's backward (2): 6 + 2h."""
    h = 0.25
    p = replace(uniform_plan(2, 1), p2p=(h, h), blocking_p2p=True)
    s = _run(p, 1)
    assert s.step_s == pytest.approx(6 + 2 * h)
    assert s.pp_s == pytest.approx(2 * h)


@pytest.mark.parametrize("pp,vp,m", LAYOUTS)
def test_blocking_costs_nothing_when_sends_are_free_and_never_less(pp, vp, m):
    """Equal passes and free sends: the exchanges add nothing (the closed-form bubble holds,
    test_planner_simulation); with sends of 0.3 s, blocking is never faster than sending in the
    background, and strictly slower interleaved (every steady iteration waits for both
    neighbours)."""
    free = uniform_plan(pp, vp)
    assert _run(replace(free, blocking_p2p=True), m).step_s == pytest.approx(_run(free, m).step_s)
    costly = replace(free, p2p=(0.3,) * pp)
    a, b = _run(costly, m).step_s, _run(replace(costly, blocking_p2p=True), m).step_s
    assert b >= a - 1e-9
    if vp > 1:
        assert b > a + 0.1


def test_two_messages_between_the_same_ranks_go_one_after_the_other():
    """At PP 2 interleaved a rank sends its activations and its gradients to the same peer in
    one exchange: one connection, so the second leaves when the first has gone (2 transfers);
    messages to and from a peer pass each other (1 transfer)."""
    from llama31_405b.planner.simulate import _exchange
    h = 0.5
    both = ((("f", 0, 0), True, h, (0, 1)), (("b", 0, 0), True, h, (0, 1)))
    posts = {(("f", 0, 0), False): 1.0, (("b", 0, 0), False): 1.0}
    assert _exchange(both, 0.0, posts) == pytest.approx(1.0 + 2 * h)
    ways = ((("f", 0, 0), True, h, (0, 1)), (("b", 1, 0), False, h, (1, 0)))
    posts = {(("f", 0, 0), False): 1.0, (("b", 1, 0), True): 1.0}
    assert _exchange(ways, 0.0, posts) == pytest.approx(1.0 + h)
    assert _exchange(ways, 0.0, {(("f", 0, 0), False): 1.0}) is None   # the peer not there yet


def test_one_pipeline_rank_makes_no_exchange():
    assert rank_program(1, 1, 3, 0) == rank_order(1, 1, 3, 0)
