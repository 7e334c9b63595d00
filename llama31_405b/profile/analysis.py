"""One rank's trace -> its steps' breakdown (seconds).

Per step window (the driver's `profile_step#k` annotation on the training thread; on GPU the
device span of the kernels that step launched):

1. Compute intervals, each with a category (attribution.py): on CPU the self time of the
   training thread's aten ops (an op's interval minus its children's), on GPU the kernels that
   are not NCCL's.
2. Communication intervals, each with its process group: gloo worker-thread and point-to-point
   events on CPU, NCCL kernels on GPU.
3. The window is cut at every boundary (intervals.partition). A piece with compute goes to
   compute (split evenly between the categories running at once, GPU streams); any collective
   running meanwhile counts it as overlapped. A piece with communication but no compute is
   exposed: split evenly between the groups running at once (the rest of each group's share
   counts as overlapped with other communication). A piece with neither is a host gap.

So compute + exposed communication + host gaps = the step window, exactly; a group's total =
overlapped + exposed = the length of the union of its intervals in the window. The pipeline
bubble (exposed time of pipeline receives: waiting for the previous stage, in the fill and
drain as well as in the steady state) is part of exposed PP time, as in the published
breakdown ("NVLink ... including pipeline bubbles"; docs/profile.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from . import attribution as at
from bisect import bisect_left

from . import waits
from .intervals import partition, union
from .trace import Trace

STEP_PREFIXES = ("profile_step#", "ProfilerStep#")
_EVAL_FN = "autograd::engine::evaluate_function: "
_P2P = ("gloo:send", "gloo:recv")


@dataclass
class GroupComm:
    desc: str
    role: str
    ranks: list = field(default_factory=list)
    total_s: float = 0.0
    overlapped_s: float = 0.0
    exposed_s: float = 0.0
    ops: dict = field(default_factory=dict)
    """Event name -> count (in the step windows)."""

    def as_dict(self) -> dict:
        return dict(desc=self.desc, role=self.role, ranks=self.ranks, total_s=self.total_s,
                    overlapped_s=self.overlapped_s, exposed_s=self.exposed_s, ops=self.ops)


@dataclass
class StepBreakdown:
    index: int
    start_us: float
    end_us: float
    compute: dict = field(default_factory=dict)
    comm: dict = field(default_factory=dict)
    """group desc -> GroupComm."""
    host_gap_s: float = 0.0
    bubble_s: float = 0.0
    exposed_pieces: dict = field(default_factory=dict, repr=False)
    """waits.group_key -> [(start, end, share)]: where the group's time was exposed, its share of
    each piece (for waits.peer_waits; not in as_dict)."""
    host_pieces: list = field(default_factory=list, repr=False)
    """[(start, end)] µs: the pieces of host gap (for bench/host_where.py; not in as_dict)."""

    @property
    def step_s(self) -> float:
        return (self.end_us - self.start_us) / 1e6

    @property
    def compute_s(self) -> float:
        return sum(self.compute.values())

    def exposed_by_role(self) -> dict:
        out = {r: 0.0 for r in at.COMM_ROLES}
        for g in self.comm.values():
            out[g.role] += g.exposed_s
        return out

    def components(self) -> dict:
        """Parts that sum to the step: compute by category, exposed communication by parallel
        dimension, host gaps."""
        out = {f"compute.{k}": v for k, v in sorted(self.compute.items())}
        out.update({f"exposed.{k}": v for k, v in self.exposed_by_role().items()})
        out["host_gap"] = self.host_gap_s
        return out

    def as_dict(self) -> dict:
        return dict(index=self.index, step_s=self.step_s, compute_s=self.compute_s,
                    compute=dict(self.compute), host_gap_s=self.host_gap_s,
                    bubble_s=self.bubble_s, components=self.components(),
                    comm={k: g.as_dict() for k, g in self.comm.items()})


@dataclass(frozen=True)
class Ctx:
    role: str | None = None
    region: str | None = None
    comm: bool = False
    group: tuple | None = None
    """(desc, ranks) of an enclosing record_param_comms (NCCL)."""
    backward: bool = False
    """Inside an autograd node's evaluation."""


_ROOT = Ctx()


def _derive(parent: Ctx, e, seq_role: dict) -> Ctx:
    n = e.name
    if n.startswith(at.ROLE_PREFIX):
        return replace(parent, role=n[len(at.ROLE_PREFIX):])
    if n == at.OPTIMIZER_ANNOTATION or n.startswith("Optimizer.step#"):
        return replace(parent, region="optimizer")
    if n == at.LOSS_ANNOTATION:
        return replace(parent, region="loss")
    if n.startswith(_EVAL_FN):
        role = seq_role.get(e.args.get("Sequence number"), parent.role)
        return replace(parent, role=role, backward=True)
    if at.is_host_comm(n):
        group = parent.group
        desc = e.args.get("Process Group Description")
        if desc:
            group = (desc, tuple(e.args.get("Process Group Ranks") or []))
        return replace(parent, comm=True, group=group)
    return parent


def walk(events, seq_role: dict, visit) -> None:
    """Depth-first over one thread's nested events: visit(event, ctx, self_intervals). A child
    that sticks out of its parent (clock rounding) is cut at the parent's end. gloo's own events
    are left out: they are recorded by the Work object, from the enqueue to the completion, and
    do not nest with the caller's ops (attribution.py)."""
    evs = sorted((e for e in events if not e.name.startswith("gloo:")),
                 key=lambda e: (e.ts, -e.dur))
    stack: list[list] = []   # [event, ctx, cursor, self intervals, end]

    def pop():
        ev, ctx, cur, selfs, end = stack.pop()
        if end > cur:
            selfs.append((cur, end))
        visit(ev, ctx, selfs)
        if stack:
            stack[-1][2] = max(stack[-1][2], end)

    for e in evs:
        while stack and stack[-1][4] <= e.ts:
            pop()
        parent = stack[-1] if stack else None
        ctx = _derive(parent[1] if parent else _ROOT, e, seq_role)
        end = e.end
        if parent is not None:
            if e.ts > parent[2]:
                parent[3].append((parent[2], e.ts))
            parent[2] = max(parent[2], e.ts)
            end = min(end, parent[4])
        stack.append([e, ctx, e.ts, [], end])
    while stack:
        pop()


def _forward_roles(events) -> dict:
    """Sequence number -> role of the forward op that created the autograd node of that number.
    An op records the number the next node will get, whether it creates one or not, so several
    ops carry a number: the last one to start (the creator, or an op inside it) gives the role;
    an op before it may lie in the previous module (e.g. the norm before linear_qkv)."""
    best: dict = {}

    def visit(e, ctx, _selfs):
        seq = e.args.get("Sequence number")
        if seq is None or e.cat != "cpu_op" or ctx.backward:
            return
        if seq not in best or e.ts >= best[seq][0]:
            best[seq] = (e.ts, ctx.role)
    walk(events, {}, visit)
    return {seq: role for seq, (_, role) in best.items() if role}


def _host_label(e, ctx) -> str | None:
    """Compute category of a CPU trace's op self time; None for host time that is not compute.
    Compute is the self time of aten's operators (the CPU's kernels) and of the annotations around
    a C kernel outside aten (`attribution.KERNEL_PREFIX`); the self time of the Python-level ops
    around them (autograd Functions such as megatron's _ReduceFromModelParallelRegion, autograd's
    evaluate_function) is host time: e.g. the wait for a synchronous collective called inside a
    Function."""
    if ctx.comm:
        return None
    if e.cat == "user_annotation" and e.name.startswith(at.KERNEL_PREFIX):   # a C kernel's call
        return at.category(False, ctx.role, ctx.region)
    if e.cat != "cpu_op" or not e.name.startswith("aten::"):
        return None
    return at.category(at.is_gemm_op(e.name), ctx.role, ctx.region)


class RankAnalysis:
    """The breakdown of every step window of one rank's trace; `meta` is the driver's sidecar
    (profile/capture.py): main_tid, groups [{desc, role, ranks, tids}], rank, host, device."""

    def __init__(self, trace: Trace, meta: dict):
        self.trace, self.meta = trace, meta
        self.gpu = trace.gpu
        self.main_tid = meta.get("main_tid")
        self.unattributed: dict = {}
        # the dimension of a group comes from its name (attribution.group_role), whatever the
        # sidecar says: the rule may have been refined since the trace was taken
        self.groups = {g["desc"]: dict(g, role=at.group_role(g["desc"]))
                       for g in meta.get("groups", [])}
        self.tid_group = {t: g["desc"] for g in meta.get("groups", []) for t in g.get("tids", [])}
        self.pp_desc = next((d for d, g in self.groups.items() if g["role"] == "PP"
                             and len(g.get("ranks", [])) > 1), None)
        self._comm: list = []
        self.steps = self._analyse()

    # -- inputs ---------------------------------------------------------------------------------
    def _windows(self, host):
        if self.meta.get("whole_trace"):
            host = [e for e in host if e.cat in ("cpu_op", "user_annotation")]
            return [(min(e.ts for e in host), max(e.end for e in host))] if host else []
        wins = sorted((e for e in host if e.name.startswith(STEP_PREFIXES)), key=lambda e: e.ts)
        return [(w.ts, w.end) for w in wins]

    def _host_events(self):
        evs = [e for e in self.trace.events if e.cat not in ("kernel", "gpu_memcpy", "gpu_memset",
                                                                "gpu_user_annotation")]
        if self.main_tid is None and self.meta.get("whole_trace"):
            counts: dict[object, int] = {}
            for e in evs:
                if e.cat == "cpu_op":
                    counts[e.tid] = counts.get(e.tid, 0) + 1
            self.main_tid = max(counts, key=lambda t: counts[t]) if counts else None  # the busiest thread
        if self.main_tid is None:
            steps = [e for e in evs if e.name.startswith(STEP_PREFIXES)]
            if not steps:
                from .trace import TraceError
                raise TraceError(f"{self.trace.path}: no step annotations (profile_step#k or "
                                 "ProfilerStep#k): not a trace of training steps")
            self.main_tid = steps[0].tid
        return evs

    def _group_of(self, desc: str) -> tuple[str, str, list]:
        g = self.groups.get(desc)
        if g:
            return desc, g["role"], g.get("ranks", [])
        return desc, at.group_role(desc), []

    def _collect(self):
        """(compute [(iv, category)], comm [(iv, desc, name)], recv [iv], windows)."""
        evs = self._host_events()
        by_tid: dict = {}
        for e in evs:
            by_tid.setdefault(e.tid, []).append(e)
        main = by_tid.get(self.main_tid, [])
        seq_role: dict = {}
        for tevs in by_tid.values():   # nesting is per thread
            seq_role.update(_forward_roles(tevs))
        compute: list[tuple] = []
        comm: list[tuple] = []
        recv: list = []
        launch_ctx: dict = {}

        def visit(e, ctx, selfs):
            if self.gpu:
                corr = e.args.get("correlation")
                if corr is not None and e.cat == "cuda_runtime":
                    launch_ctx[corr] = ctx
                return
            label = _host_label(e, ctx)
            if label is not None:
                compute.extend((iv, label) for iv in selfs)
        for tid, tevs in by_tid.items():
            if self.gpu or tid == self.main_tid:
                walk(tevs, seq_role, visit)
        if self.gpu:
            self._gpu_events(launch_ctx, evs, compute, comm, recv)
        else:
            for e in evs:
                if not e.name.startswith("gloo:"):
                    continue
                desc = self.tid_group.get(e.tid)
                if desc is None and e.name in _P2P:
                    desc = self.pp_desc or "p2p (no pipeline group)"
                    if e.name == "gloo:recv":
                        recv.append((e.ts, e.end))
                if desc is None:
                    desc = "unattributed"
                    self.unattributed[e.name] = self.unattributed.get(e.name, 0) + 1
                comm.append(((e.ts, e.end), desc, e.name))
        return compute, comm, recv, self._windows(main)

    def _gpu_events(self, launch_ctx, host, compute, comm, recv):
        ext_group = {}
        for e in host:
            if at.is_host_comm(e.name) and e.args.get("Process Group Description"):
                ext_group[e.args.get("External id")] = (e.args["Process Group Description"],
                                                        e.args.get("Process Group Ranks") or [])
        for k in self.trace.events:
            if k.cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
                continue
            ctx = launch_ctx.get(k.args.get("correlation"), _ROOT)
            if at.is_nccl_kernel(k.name):
                desc = k.args.get("Process Group Description")
                if not desc and ctx.group:
                    desc = ctx.group[0]
                if not desc and k.args.get("External id") in ext_group:
                    desc = ext_group[k.args["External id"]][0]
                if not desc:
                    desc = "unattributed"
                    self.unattributed[k.name] = self.unattributed.get(k.name, 0) + 1
                comm.append(((k.ts, k.end), desc, k.name))
                if "SendRecv" in k.name or "Recv" in k.name:
                    if self.groups.get(desc, {}).get("role", at.group_role(desc)) == "PP":
                        recv.append((k.ts, k.end))
                continue
            if k.cat != "kernel":
                label = "other"
            elif at.is_attention_kernel(k.name):
                label = "attention"
            else:
                label = at.category(at.is_gemm_kernel(k.name), ctx.role, ctx.region)
            compute.append(((k.ts, k.end), label))

    def _device_windows(self, host_windows, compute, comm):
        """GPU: a step's device span runs from the first kernel it launched to the next step's
        first kernel (the last one: to its last kernel's end)."""
        if not host_windows:
            return []
        starts = []
        items = [iv for iv, *_ in compute] + [iv for iv, *_ in comm]
        items.sort()
        for lo, hi in host_windows:
            first = next((s for s, e in items if s >= lo), None)
            starts.append(first)
        out = []
        for i, s in enumerate(starts):
            if s is None:
                continue
            nxt = starts[i + 1] if i + 1 < len(starts) and starts[i + 1] is not None else None
            if nxt is None:
                nxt = max((e for s2, e in items if s2 >= s), default=s)
            out.append((s, nxt))
        return out

    # -- the breakdown ----------------------------------------------------------------------------
    def _analyse(self) -> list[StepBreakdown]:
        compute, comm, recv, windows = self._collect()
        self._comm = comm
        if self.gpu:
            windows = self._device_windows(windows, compute, comm)
        # one union per label first: thousands of adjacent self-time pieces become a few
        by_label: dict = {}
        for x, cat in compute:
            by_label.setdefault(("c", cat), []).append(x)
        for x, desc, _ in comm:
            by_label.setdefault(("m", desc), []).append(x)
        for x in recv:
            by_label.setdefault(("b", None), []).append(x)
        labelled = sorted(((x, label) for label, xs in by_label.items() for x in union(xs)),
                          key=lambda p: p[0])
        starts = [x[0] for x, _ in labelled]
        longest = max((x[1] - x[0] for x, _ in labelled), default=0.0)
        out = []
        for i, (lo, hi) in enumerate(windows):
            st = StepBreakdown(i, lo, hi)
            near = labelled[bisect_left(starts, lo - longest):bisect_left(starts, hi)]
            for iv, desc, name in comm:
                if iv[1] > lo and iv[0] < hi:
                    g = st.comm.get(desc)
                    if g is None:
                        d, role, ranks = self._group_of(desc)
                        g = st.comm[desc] = GroupComm(d, role, list(ranks))
                    g.ops[name] = g.ops.get(name, 0) + 1
            for s, e, labels in partition(near, lo, hi):
                length = (e - s) / 1e6
                cats = [x for k, x in labels if k == "c"]
                groups = [x for k, x in labels if k == "m"]
                if cats:
                    for c in cats:
                        st.compute[c] = st.compute.get(c, 0.0) + length / len(cats)
                    for d in groups:
                        st.comm[d].total_s += length
                        st.comm[d].overlapped_s += length
                elif groups:
                    for d in groups:
                        g = st.comm[d]
                        g.total_s += length
                        g.exposed_s += length / len(groups)
                        g.overlapped_s += length - length / len(groups)
                        st.exposed_pieces.setdefault(waits.group_key(g.role, g.ranks), []).append(
                            (s, e, 1 / len(groups)))
                    if any(k == "b" for k, _ in labels):
                        st.bubble_s += length
                else:
                    st.host_gap_s += length
                    st.host_pieces.append((s, e))
            out.append(st)
        return out

    # -- summaries ----------------------------------------------------------------------------
    def wait_inputs(self) -> dict:
        """What `waits.peer_waits` needs of this rank: its collective calls and, per step, where
        each group's time was exposed (µs), by group key; each key's dimension."""
        calls = waits.rank_calls(self._comm, self._group_of)
        roles = {waits.group_key(role, ranks): role
                 for role, ranks in (self._group_of(d)[1:] for _, d, _ in self._comm)}
        return {"calls": calls, "exposed": [st.exposed_pieces for st in self.steps],
                "roles": {k: roles[k] for k in calls}}

    def mean(self) -> dict:
        """Mean over the steps: step_s, compute_s, components, comm per group, bubble."""
        n = len(self.steps) or 1
        comps: dict = {}
        groups: dict = {}
        for st in self.steps:
            for k, v in st.components().items():
                comps[k] = comps.get(k, 0.0) + v / n
            for d, g in st.comm.items():
                acc = groups.setdefault(d, {"desc": d, "role": g.role, "ranks": g.ranks,
                                            "total_s": 0.0, "overlapped_s": 0.0,
                                            "exposed_s": 0.0, "ops": {}})
                for k in ("total_s", "overlapped_s", "exposed_s"):
                    acc[k] += getattr(g, k) / n
                for op, c in g.ops.items():
                    acc["ops"][op] = acc["ops"].get(op, 0) + c
        return dict(steps=len(self.steps),
                    step_s=sum(s.step_s for s in self.steps) / n,
                    compute_s=sum(s.compute_s for s in self.steps) / n,
                    host_gap_s=sum(s.host_gap_s for s in self.steps) / n,
                    bubble_s=sum(s.bubble_s for s in self.steps) / n,
                    exposed_s=sum(sum(s.exposed_by_role().values()) for s in self.steps) / n,
                    components=comps, comm=groups, unattributed=dict(self.unattributed))


def compute_split(trace_path, *, groups=()) -> dict:
    """The whole trace as one window (no step annotations needed, e.g. one layer's forward and
    backward under torch.profiler with `capture.annotate_modules`): compute seconds by
    category, exposed communication by dimension, host gaps, and the window. For a GPU
    check of the GEMM split against the planner's per-layer compute (first contact)."""
    from .trace import load
    ra = RankAnalysis(load(trace_path), {"whole_trace": True, "groups": list(groups)})
    st = ra.steps[0]
    return dict(window_s=st.step_s, compute=dict(st.compute), components=st.components(),
                gpu=ra.gpu)
