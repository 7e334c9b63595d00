"""A discrete-event simulation of one training step as Megatron runs it.

One pipeline (its PP ranks) is simulated; TP, CP and DP peers do the same work at the same time,
so a DP collective finishes for all of its members when it finishes for one. Each rank runs its
passes in Megatron's order (pipeline.rank_order) on one compute stream; a pass lasts its compute
plus its TP and CP communication (costs.py). How it waits for its input depends on the schedule:
* interleaved with overlap_p2p_comm (GPUs): a pass starts when the rank is free and its input
  has arrived (the previous rank's pass plus the send, which runs in the background);
* otherwise (Plan.blocking_p2p: plain 1F1B, and interleaving on gloo) the rank makes Megatron's
  exchanges between its passes (pipeline.rank_program) and waits in each until all of its sends
  and receives are done; a message is done one transfer after both its ends have posted it (a
  rendezvous: the sender waits for the receiver too) and after the exchange's earlier message
  between the same two ranks (one connection per pair). Interleaved, each steady-state
  iteration's exchange receives the next forward's input and the next backward's gradient
  together, after both passes: the ranks go in lockstep.
Not modelled: interleaved on GPUs, megatron-core 0.19.2 still blocks in the warm-up's and the
cool-down's exchanges (the builder leaves overlap_p2p_comm_warmup_flush off); the simulation
sends those in the background too.

DP runs on a second stream per rank, one collective at a time in launch order:
* gradient reduce-scatter of a chunk when Megatron's grad_sync_func fires (the backward whose
  virtual id minus the pipeline rank is the chunk's last microbatch; chunks left at the end are
  launched after the last backward); without interleaving, pipeline rank 0 starts its buckets
  during the last backward (all but the last from when the first bucket's share of the pass is
  done, the last when it ends), the others after it;
* parameter all-gather of chunks 0 and 1 at the step's start and of chunk c+1 before the forward
  whose virtual id plus the pipeline rank is chunk c's first microbatch (param_sync_func,
  align_param_gather); the first forward of a chunk waits for its gather (`first_gather_s`: for
  Megatron's one bucketed chunk, the first bucket at VP 1, the whole chunk when interleaved,
  since megatron-core 0.19.2 dispatches its bucket groups in reverse order of use).
While a DP collective runs, the pass in progress slows down (NCCL's SMs and HBM traffic: the
Plan's contention factors). The step ends when the last rank has drained its DP stream and scaled
its gradients, then all ranks run the optimizer together (its gradient-norm all-reduce
synchronises them).

Every rank's time splits into compute (with the slowdown), TP, CP, pipeline waits (the send of
the awaited input), bubble (other waits for input), exposed DP (waiting for a gather, draining
the reduce-scatters), the end-of-step work and, on the ranks that finish before the critical one
(the last), the wait for it; they sum to the step. Once the pipeline's steady state is reached the step is periodic in groups of PP
microbatches, so a long step is extrapolated linearly from the first two groups that add the
same time (tests check this against a full run).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .costs import ChunkCost, Plan
from .pipeline import Exchange, rank_order, rank_program, schedule_table


def first_gather_s(chunk: ChunkCost, aligned: bool) -> float:
    """Seconds from the start of a chunk's parameter all-gather in a training step until the
    bucket its first forward uses has arrived: the whole chunk's gather when its bucket groups
    are dispatched together in megatron-core 0.19.2's order (`aligned`: the interleaved
    schedule's param_sync_func, DistributedDataParallel.start_param_sync over `bucket_groups`,
    which DDP builds in reverse order of use), the share of the bucket used first otherwise
    (the last of the layout: the forward pre-hooks' chain, `next_param_gather_bucket_group`,
    runs in order of use)."""
    return chunk.gather_s if aligned else chunk.gather_s * chunk.last_bucket_share


@dataclass(frozen=True, slots=True)
class Sim:
    step_s: float
    critical_rank: int
    compute_s: float
    """Compute of this rank without contention."""
    slowdown_s: float
    """Extra compute time while DP collectives ran."""
    tp_s: float
    cp_s: float
    pp_s: float
    """Waits for input covered by the send of that input (blocking: the exchange's transfer)."""
    bubble_s: float
    """Other waits for input: pipeline fill and drain, unequal ranks."""
    dp_wait_s: float
    """Waits for parameter gathers before a chunk's first forward."""
    dp_drain_s: float
    """After the last backward, waiting for the reduce-scatters."""
    finalize_s: float
    optimizer_s: float
    dp_total_s: float
    """DP collective time of this rank, overlapped or not."""
    sync_s: float = 0.0
    """Waiting at the step's end for the last rank to finish (the gradient-norm all-reduce
    synchronises the ranks): zero on the critical rank."""
    host_s: float = 0.0
    """Host time of this rank's passes and of its step outside them (Plan.host_step_s): nothing
    running, a CPU's Python between ops."""
    turns_s: float = 0.0
    """Extra compute while another pipeline stage on this rank's core ran (Plan.stages_per_core;
    its TP, CP and host time's stretch is in tp_s, cp_s and host_s)."""
    host_under_dp_s: float = 0.0
    """Of host_s, the passes' host time while a DP collective ran (`covered`): a profile counts
    such a piece as exposed DP, not as a host gap (model revision 19)."""

    def scaled(self, other: "Sim", k: float) -> "Sim":
        """self + k x (self - other), field by field (linear extrapolation)."""
        vals = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            vals[f.name] = a if f.name == "critical_rank" else a + k * (a - b)
        return Sim(**vals)


def _operations(plan: Plan, r: int, x: Exchange, sent: dict[str, int],
                got: dict[str, int]) -> tuple[tuple[tuple, bool, float, tuple[int, int]], ...]:
    """The messages of exchange `x` of pipeline rank `r`: ((channel, message number), send?,
    transfer seconds, (sender, receiver)). Channel ("f", s) carries activations from rank s to
    the next, ("b", s) gradients from rank s to the previous; each is first in, first out
    (megatron-core posts them in the same order on both ends). `sent`/`got`: the rank's counts
    so far, updated."""
    pp = plan.pp
    nxt, prv = (r + 1) % pp, (r - 1) % pp
    ops = []
    for kind, on, src, send in (("f", x.send_next, r, True), ("b", x.send_prev, r, True),
                                ("f", x.recv_prev, prv, False), ("b", x.recv_next, nxt, False)):
        if on:
            count = sent if send else got
            hop = plan.p2p[src] if kind == "f" else plan.p2p[(src - 1) % pp]
            dst = (src + 1) % pp if kind == "f" else (src - 1) % pp
            ops.append(((kind, src, count[kind]), send, hop, (src, dst)))
            count[kind] += 1
    return tuple(ops)


def _exchange(ops: tuple[tuple[tuple, bool, float, tuple[int, int]], ...], at: float,
              posts: dict[tuple, float]) -> float | None:
    """When a blocking exchange posted at `at` ends: each message one transfer after both its
    ends have posted it (a rendezvous) and the exchange's earlier message between the same two
    ranks has gone (one connection per pair: at PP 2 interleaved, a rank's activations and
    gradients both go to the other rank, one after the other), the exchange when all have; None
    while a peer has not posted yet (posting is recorded once)."""
    end = at
    for key, send, hop, pair in ops:
        posts.setdefault((key, send), at)
    gone: dict[tuple[int, int], float] = {}
    for key, send, hop, pair in ops:
        other = posts.get((key, not send))
        if other is None:
            return None
        gone[pair] = max(gone.get(pair, at), at, other) + hop
        end = max(end, gone[pair])
    return end


def _finish(start: float, work: float, infl: float, busy: list[tuple[float, float]], lo: int) -> float:
    """End of a pass of `work` seconds starting at `start`, slowed by 1 + infl while the DP
    stream is busy (`busy[lo:]`: the intervals that may still overlap it)."""
    t, w = start, work
    if infl > 0:
        for i in range(lo, len(busy)):
            s, e = busy[i]
            if e <= t:
                continue
            if s > t:
                if t + w <= s:
                    return t + w
                w -= s - t
                t = s
            cap = (e - t) / (1 + infl)
            if w <= cap:
                return t + w * (1 + infl)
            w -= cap
            t = e
    return t + w


def covered(busy: list[tuple[float, float]], lo: int, start: float, end: float) -> float:
    """Seconds of [start, end] during which the DP stream ran (`busy[lo:]`, in time order)."""
    out = 0.0
    for s, e in busy[lo:]:
        if s >= end:
            break
        out += max(0.0, min(e, end) - max(s, start))
    return out


def run(plan: Plan, m: int, cache: dict[int, tuple[Sim, ...]] | None = None,
        rank: int | None = None) -> Sim:
    """The step with m microbatches per DP rank, as pipeline rank `rank` spends it (default:
    the critical rank). Beyond 4 x PP microbatches, once two consecutive groups of PP
    microbatches add the same time, the step is periodic and the rest is extrapolated from the
    last two groups. `cache` keeps the runs of this plan by number of microbatches."""
    cache = {} if cache is None else cache

    def one(k: int) -> tuple[Sim, ...]:
        if k not in cache:
            cache[k] = _ranks(plan, k)
        return cache[k]

    def pick(sims: tuple[Sim, ...]) -> Sim:
        return sims[sims[0].critical_rank if rank is None else rank]

    p = max(plan.pp, 1)
    k = 3
    while m % p == 0 and (k + 1) * p < m:
        a, b, c = (pick(one(j * p)) for j in (k - 1, k, k + 1))
        if abs((c.step_s - b.step_s) - (b.step_s - a.step_s)) <= 1e-7 * c.step_s:
            return c.scaled(b, (m - (k + 1) * p) / p)
        k += 1
    return pick(one(m))


def _run(plan: Plan, m: int, rank: int | None = None) -> Sim:
    """The step without extrapolation, as pipeline rank `rank` (default: the critical one)
    spends it."""
    sims = _ranks(plan, m)
    return sims[sims[0].critical_rank if rank is None else rank]


TURN_ROUNDS = 200
"""Most rounds of the stages-sharing-a-core fixed point (`_ranks`); it settles in a few dozen."""


def _ranks(plan: Plan, m: int) -> tuple[Sim, ...]:
    """Every pipeline rank's step. Where stages share a core (Plan.stages_per_core), each pass
    runs at a share of the core while other stages of its block run, at full speed otherwise
    (processor sharing: 1 / (1 + the core-mates running)): a fixed point of each pass's stretch,
    the event loop run with the stretches the previous round's timeline gives (damped by half),
    until no stretch moves by a billionth."""
    if plan.stages_per_core == 1:
        return _event_loop(plan, m, None)[0]
    fac: list[list[float]] | None = None
    for _ in range(TURN_ROUNDS):
        sims, spans = _event_loop(plan, m, fac)
        new = _turn_factors(spans, plan.stages_per_core)
        if fac is not None and all(abs(a - b) <= 1e-9 * a for fa, fb in zip(fac, new)
                                   for a, b in zip(fa, fb)):
            return sims
        fac = new if fac is None else [[(a + b) / 2 for a, b in zip(fa, fb)]
                                       for fa, fb in zip(fac, new)]
    raise RuntimeError(f"step simulation: the turns of {plan.stages_per_core} stages per core did "
                       f"not settle in {TURN_ROUNDS} rounds (PP {plan.pp}, VP {plan.vp}, m {m})")


def _turn_factors(spans: list[list[tuple[float, float] | None]], per_core: int) -> list[list[float]]:
    """Per rank and record (None: an exchange, factor 1), the stretch under processor sharing
    that its pass's interval in `spans` implies: its length over the work the core gave it,
    1 / (1 + the other stages of its block running) at each moment."""
    out = []
    for r, own in enumerate(spans):
        block = range(r - r % per_core, r - r % per_core + per_core)
        mates = sorted(iv for q in block if q != r and q < len(spans) for iv in spans[q]
                       if iv is not None and iv[1] > iv[0])
        facs = []
        for iv in own:
            if iv is None or iv[1] <= iv[0]:
                facs.append(1.0)
                continue
            s, e = iv
            cuts = sorted({s, e, *(x for a, b in mates for x in (a, b) if s < x < e)})
            got = 0.0
            for a, b in zip(cuts, cuts[1:]):
                mid = (a + b) / 2
                running = sum(1 for x, y in mates if x <= mid < y)
                got += (b - a) / (1 + running)
            facs.append((e - s) / got)
        out.append(facs)
    return out


def _event_loop(plan: Plan, m: int,  # noqa: C901 (one event loop, kept in one place)
                fac: list[list[float]] | None) -> tuple[tuple[Sim, ...], list[list]]:
    """The step's event loop, each pass's work stretched by `fac` [rank][record] (None: 1):
    every rank's Sim, and per rank and record the pass's busy interval (None: an exchange)."""
    pp, vp = plan.pp, plan.vp
    total = m * vp
    inter = vp > 1
    table = schedule_table(m, vp, pp) if inter else None
    blocking = plan.blocking_p2p and pp > 1
    orders = [(rank_program if blocking else rank_order)(pp, vp, m, r) for r in range(pp)]
    ch = plan.chunks
    infl = [[(plan.inflation(c.fwd, c.work_fwd, r), plan.inflation(c.bwd, c.work_bwd, r))
             for c in row] for r, row in enumerate(ch)]
    n = pp * vp * m
    ptr, t = [0] * pp, [0.0] * pp
    busy: list[list[tuple[float, float]]] = [[] for _ in range(pp)]
    free = [0.0] * pp
    gather_first, gather_end = [[0.0] * vp for _ in range(pp)], [[0.0] * vp for _ in range(pp)]
    reduced = [[False] * vp for _ in range(pp)]
    slow, wait_pp, wait_bub, wait_dp = [0.0] * pp, [0.0] * pp, [0.0] * pp, [0.0] * pp

    def launch(r: int, at: float, dur: float) -> tuple[float, float]:
        if dur <= 0:
            return at, at
        s = max(at, free[r])
        free[r] = s + dur
        busy[r].append((s, s + dur))
        return s, s + dur

    def gather(r: int, c: int, at: float) -> None:
        cc = ch[r][c]
        s, e = launch(r, at, cc.gather_s)
        # interleaved (align_param_gather): megatron-core 0.19.2's param_sync_func
        # (DistributedDataParallel.start_param_sync) dispatches a chunk's bucket groups in list
        # order, the reverse of their use, so the bucket the first forward needs arrives last;
        # at VP 1 the pre-hooks' chain gathers in order of use (`first_gather_s`)
        aligned = inter and plan.overlap_param
        gather_first[r][c], gather_end[r][c] = s + first_gather_s(cc, aligned), e

    def reduce(r: int, c: int, at: float) -> None:
        if not reduced[r][c]:
            reduced[r][c] = True
            launch(r, at, ch[r][c].reduce_s)

    if plan.overlap_param:
        for r in range(pp):
            for c in range(min(2, vp) if inter else 1):
                gather(r, c, 0.0)

    # per rank, per pass: (own slot, input slot or -1, send seconds, work, contention factor,
    # gather to launch before it, chunk whose first forward waits for its gather, reduce after,
    # pipeline rank 0's early reduce, None); per blocking exchange: (..., its operations)
    recs = []
    parts: list[list[tuple[float, float, float, float]]] = []   # (compute, TP, CP, host) per record
    for r in range(pp):
        rec: list[tuple] = []
        own_parts: list[tuple[float, float, float, float]] = []
        parts.append(own_parts)
        kf = kb = 0
        sent = {"f": 0, "b": 0}
        got = {"f": 0, "b": 0}
        for item in orders[r]:
            if isinstance(item, Exchange):
                rec.append((-1, -1, 0.0, 0.0, 0.0, -1, -1, -1, False,
                            _operations(plan, r, item, sent, got)))
                own_parts.append((0.0, 0.0, 0.0, 0.0))
                continue
            fwd, mb, c = item
            cc = ch[r][c]
            own = (r * vp + c) * m + mb
            if fwd:
                if r > 0:
                    dep, hop = ((r - 1) * vp + c) * m + mb, plan.p2p[r - 1]
                elif c > 0:
                    dep, hop = ((pp - 1) * vp + c - 1) * m + mb, plan.p2p[pp - 1]
                else:
                    dep, hop = -1, 0.0
                g = -1
                if table is not None and plan.overlap_param:   # (interleaved)
                    j = kf + r
                    if j < total and table[j][0] == 0 and 1 < table[j][1] + 1 < vp:
                        g = table[j][1] + 1
                kf += 1
                wait = c if plan.overlap_param and mb == 0 and cc.gather_s > 0 else -1
                work = cc.work_fwd + (cc.first_fwd_s if mb == 0 else 0.0)
                if blocking:   # the input came with an earlier exchange
                    dep, hop = -1, 0.0
                rec.append((own, dep, hop, work, infl[r][c][0], g, wait, -1, False, None))
                own_parts.append((cc.fwd.total + (cc.first_fwd_s if mb == 0 else 0.0), cc.tp_fwd,
                             cc.cp_fwd, cc.host_fwd))
            else:
                if r < pp - 1:
                    dep, hop = n + ((r + 1) * vp + c) * m + mb, plan.p2p[r]
                elif c < vp - 1:
                    dep, hop = n + c * m + mb + m, plan.p2p[pp - 1]  # rank 0, chunk c+1
                else:
                    dep, hop = own, 0.0
                red = -1
                if table is not None and plan.overlap_grad:    # (interleaved)
                    j = kb - r
                    if 0 <= j < total and table[j][0] == m - 1:
                        red = vp - 1 - table[j][1]
                kb += 1
                early = not inter and plan.overlap_grad and mb == m - 1 and r == 0
                if blocking:
                    dep, hop = -1, 0.0
                rec.append((n + own, dep, hop, cc.work_bwd, infl[r][c][1], -1, -1, red, early, None))
                own_parts.append((cc.bwd.total, cc.tp_bwd, cc.cp_bwd, cc.host_bwd))
        recs.append(rec)
    ends = [-1.0] * (2 * n)
    posts: dict[tuple, float] = {}   # (channel, message, send?) -> when its rank posted it
    lo = [0] * pp
    spans: list[list] = [[None] * len(rec) for rec in recs]
    turns = [[0.0, 0.0, 0.0, 0.0] for _ in range(pp)]   # extra compute, TP, CP, host
    under = [0.0] * pp   # the passes' host time while the DP stream ran
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            rec, p = recs[r], ptr[r]
            tr, br = t[r], busy[r]
            while p < len(rec):
                own, dep, hop, work, inf, g, wait, red, early, ops = rec[p]
                stretch = fac[r][p] if fac is not None and ops is None else 1.0
                work *= stretch
                if ops is not None:
                    done = _exchange(ops, tr, posts)
                    if done is None:
                        break
                    w, most = done - tr, max(op[2] for op in ops)
                    wait_pp[r] += min(most, w)
                    wait_bub[r] += w - min(most, w)
                    tr = done
                    p += 1
                    progress = True
                    continue
                if dep >= 0:
                    d = ends[dep]
                    if d < 0:
                        break
                    ready = d + hop
                else:
                    ready = 0.0
                start = tr
                if ready > tr:
                    w = ready - tr
                    part = hop if hop < w else w
                    wait_pp[r] += part
                    wait_bub[r] += w - part
                    start = ready
                if g >= 0:
                    gather(r, g, start)
                tail = 0.0
                if wait >= 0:
                    g0 = gather_first[r][wait]
                    if g0 > start:
                        wait_dp[r] += g0 - start
                        start = g0
                    # the forward's work on the bucket whose parameters arrive last
                    tail = gather_end[r][wait] + work * ch[r][wait].first_bucket_share
                if early:   # every bucket but the last, from when the first one's gradients are ready
                    cc = ch[r][0]
                    launch(r, start + work * cc.first_bucket_share,
                           cc.reduce_s * (1.0 - cc.last_bucket_share))
                    reduced[r][0] = True
                while lo[r] < len(br) and br[lo[r]][1] <= start:
                    lo[r] += 1
                done = _finish(start, work, inf, br, lo[r]) if lo[r] < len(br) else start + work
                spans[r][p] = (start, done)
                host = parts[r][p][3] * stretch
                if host > 0 and done > start and lo[r] < len(br):
                    # the host time spread over the pass: its share under a DP collective reads
                    # as exposed DP in a profile (profile/analysis.py: communication, no compute)
                    under[r] += host * covered(br, lo[r], start, done) / (done - start)
                if stretch != 1.0:   # the pass ran: its parts' share of the stretch
                    for i, v in enumerate(parts[r][p]):
                        turns[r][i] += (stretch - 1.0) * v
                end = done if done >= tail else tail
                wait_dp[r] += end - done
                slow[r] += done - start - work
                ends[own] = end
                if red >= 0:
                    reduce(r, red, end)
                if early:   # the last bucket's gradients are ready when the backward ends
                    launch(r, end, ch[r][0].reduce_s * ch[r][0].last_bucket_share)
                tr = end
                p += 1
                progress = True
            ptr[r], t[r] = p, tr
    if any(p < len(o) for p, o in zip(ptr, recs)):
        raise RuntimeError(f"step simulation deadlocked (PP {pp}, VP {vp}, m {m})")
    fin = []
    for r in range(pp):
        for c in range(vp):
            reduce(r, c, t[r])
        fin.append(max(t[r], free[r]) + plan.finalize_s[r])
    crit = max(range(pp), key=lambda r: fin[r])
    tail = plan.optimizer_s + plan.zero_s + plan.host_s  # the host time per step apart (host_s)
    out = []
    for r in range(pp):
        row = ch[r]
        comp = m * sum(c.fwd.total + c.bwd.total for c in row) + sum(c.first_fwd_s for c in row)
        tc, tt, tcp, th = turns[r]
        out.append(Sim(step_s=fin[crit] + tail + plan.host_step_s, critical_rank=crit,
                       compute_s=comp,
                       slowdown_s=slow[r], tp_s=m * sum(c.tp_fwd + c.tp_bwd for c in row) + tt,
                       cp_s=m * sum(c.cp_fwd + c.cp_bwd for c in row) + tcp, pp_s=wait_pp[r],
                       host_s=m * sum(c.host_fwd + c.host_bwd for c in row) + th + plan.host_step_s,
                       bubble_s=wait_bub[r], dp_wait_s=wait_dp[r],
                       dp_drain_s=max(0.0, free[r] - t[r]), finalize_s=plan.finalize_s[r],
                       optimizer_s=tail, dp_total_s=sum(e - s for s, e in busy[r]),
                       sync_s=fin[crit] - fin[r], turns_s=tc, host_under_dp_s=under[r]))
    return tuple(out), spans
