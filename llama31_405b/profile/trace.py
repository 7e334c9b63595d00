"""Reading a torch.profiler Chrome trace (JSON, optionally gzipped) into plain events.

Only complete events ("ph": "X") matter to the analysis; thread names come from the "M"
metadata events, and `distributedInfo` (torch 2.13: backend, rank, world_size, pg_config with
each process group's pg_name, pg_desc and ranks) is kept as it is.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(slots=True)
class Event:
    name: str
    cat: str
    ts: float
    """Start, microseconds."""
    dur: float
    tid: object
    pid: object
    args: dict

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class Trace:
    events: list[Event]
    thread_names: dict = field(default_factory=dict)
    """(pid, tid) -> name from the trace's metadata."""
    distributed: dict = field(default_factory=dict)
    """The trace's distributedInfo (empty when the run was not distributed)."""
    path: str = ""

    @property
    def gpu(self) -> bool:
        """A device trace: CUDA kernel events present."""
        return any(e.cat == "kernel" for e in self.events)


class TraceError(ValueError):
    pass


def load(path: str | Path) -> Trace:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError, EOFError) as e:
        raise TraceError(f"{path}: not a readable Chrome trace ({e})") from None
    return parse(data, str(path))


def parse(data, path: str = "") -> Trace:
    raw = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(raw, list):
        raise TraceError(f"{path or '<trace>'}: no traceEvents list (is this a Chrome trace "
                         "written by torch.profiler's export_chrome_trace?)")
    events, names = [], {}
    for e in raw:
        ph = e.get("ph")
        if ph == "X" and "dur" in e:
            events.append(Event(str(e.get("name", "")), str(e.get("cat", "")), float(e["ts"]),
                                float(e["dur"]), e.get("tid"), e.get("pid"), e.get("args") or {}))
        elif ph == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = (e.get("args") or {}).get("name", "")
    dist = data.get("distributedInfo", {}) if isinstance(data, dict) else {}
    return Trace(events=events, thread_names=names, distributed=dist or {}, path=path)
