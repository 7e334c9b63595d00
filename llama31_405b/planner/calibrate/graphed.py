"""A profile of a run with full-iteration CUDA graphs (the GB200 default) -> the figures of its
replayed step.

`profile` cannot trace a replay by role or process group (a replay launches no host op), so with
full-iteration graphs it times `baseline` replayed steps, then as many eager steps (Megatron's
schedule called directly), both without the profiler, and traces eager steps
(profile/capture.py; docs/profile.md, "CUDA graphs"). The run the planner predicts replays: a
summary of such a profile describes the replayed step, from the eager trace and the two timings
each rank recorded (ranks/rank<R>.json: `baseline_step_s` replayed, `eager_step_s` eager):

* the step: the trace's eager step times replayed / eager (the ratio of the untraced timings),
  i.e. the replayed step as the profiler would have measured it (the convention of every
  profile: the summary's step is its trace's);
* the components: a graph replays the same kernels the eager step launches (it captured them),
  so what it saves is time the device spent not running kernels of its own: first the host
  gaps (nothing running: the device waited for the host to launch), then exposed
  communication (a collective or receive waiting for a peer whose host launches late, the
  pipeline's bubble included), each kind in proportion to its exposed time (its waiting for a
  slower peer with it); the DP collectives' total loses what DP's exposed time lost. Compute keeps its eager time, unless replay saved
  more than the host gaps and the exposed communication together, when the compute parts give
  up the rest in proportion (kernel for kernel the same work: not expected, stated so the
  figures still add up to the replayed step). A replay slower than the eager step (not expected
  either) adds the difference to the host gaps. Host gaps removed first, rather than every
  component scaled by one ratio: a uniform scale would shorten the kernels, which a replay
  does not, and on a host-bound trace (gaps longer than what replay saved) lengthen them.

The allocator's peaks of a graphed profile are read after its replayed steps, before the first
eager one (capture.py `memory_at`): the eager steps allocate their activations outside the
captured graph's pool while the pool is still held, peaks no graphed run reaches.
"""
from __future__ import annotations

from dataclasses import replace

from .summary import Summary


def replay_ratio(records: list[dict], source: str) -> float | None:
    """Replayed / eager step time over the rank records of a graphed profile (the mean of each
    timing over the records); None when the run was not graphed. A graphed profile without
    replayed or eager timings (`--baseline 0`) is refused (ValueError naming `source`): its
    trace alone predicts eager steps."""
    graphed = [r for r in records if r.get("cuda_graphs")]
    if not graphed:
        return None
    replayed = [t for r in graphed for t in r.get("baseline_step_s") or ()]
    eager = [t for r in graphed for t in r.get("eager_step_s") or ()]
    if not replayed or not eager:
        raise ValueError(f"{source}: a profile of a run with full-iteration CUDA graphs without "
                         "replayed and eager steps timed (profile --baseline 0?): its trace holds "
                         "eager steps only, and a graphed run replays; profile again with "
                         "--baseline N (N >= 1)")
    return (sum(replayed) / len(replayed)) / (sum(eager) / len(eager))


def as_replayed(s: Summary, ratio: float) -> Summary:
    """The summary `s` of an eager trace as the replayed step (module docstring): `ratio` is
    replayed / eager, the step becomes `s.step_s * ratio`."""
    step = s.step_s * ratio
    saved = s.step_s - step
    host = s.host_s or 0.0
    new_host = max(0.0, host - saved)
    left = saved - (host - new_host)
    exposed = dict(s.exposed)
    total = sum(exposed.values())
    cut = min(left, total) if left > 0 else 0.0
    keep = 1.0 - cut / total if total > 0 else 1.0
    new_exposed = {k: v * keep for k, v in exposed.items()}
    left -= cut
    parts = dict(s.parts)
    compute_s = s.compute_s
    if left > 0:
        k = 1.0 - left / compute_s
        parts = {p: v * k for p, v in parts.items()}
        compute_s *= k
    dp_total = s.dp_total_s
    if dp_total is not None:
        dp_total = max(0.0, dp_total - (exposed.get("DP", 0.0) - new_exposed.get("DP", 0.0)))
    return replace(s, step_s=step, eager_step_s=s.step_s, compute_s=compute_s,
                   parts=tuple(sorted(parts.items())), exposed=tuple(sorted(new_exposed.items())),
                   dp_total_s=dp_total, host_s=new_host,
                   waiting=tuple((k, v * keep) for k, v in s.waiting))
