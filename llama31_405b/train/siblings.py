"""Which ranks next to this one have ended: the rank a run lost, named in its MLPerf log.

A launcher starts the ranks of a node as children of one process (torchrun's agent; slurmstepd
under srun) and, when one of them ends, stops the others with SIGTERM. The survivors learn of it
only as that signal, or as a collective that fails without naming the peer. So each rank takes a
snapshot of its siblings when the run starts (`Siblings.snapshot`: the processes of the same
parent that carry a rank, RANK or SLURM_PROCID, in their environment, read from /proc), and on a
stop asks which of them have ended (`lost`): gone, a zombie its launcher has not reaped yet, or
a pid now of another process. Ranks on other nodes are not seen: the reason then stays generic.
Linux only; elsewhere, or where /proc cannot be read, the snapshot is empty.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

_RANK_VARS = ("RANK", "SLURM_PROCID")


PF_EXITING = 0x4
"""Linux's task flag, set first thing in do_exit, before the process closes its files: a rank
that sees its connection to a killed peer close finds the flag already set, while the peer's
state still reads running (it turns zombie only at the end of do_exit)."""


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None when it is gone; the state "X" (dead) for a
    process already exiting (PF_EXITING in its flags, the ninth field)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()     # the name may hold spaces and ')'
    return ("X" if int(fields[6]) & PF_EXITING else fields[0]), int(fields[1])


def _rank_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return None
    for name in _RANK_VARS:
        value = env.get(name.encode(), b"").decode(errors="replace")
        if value.isdigit():
            return int(value)
    return None


@dataclass
class Siblings:
    parent: int
    ranks: dict[int, int] = field(default_factory=dict)
    """rank -> pid of the other ranks started by `parent`."""

    @classmethod
    def of_this_rank(cls) -> "Siblings":
        """The snapshot of this process's siblings; empty unless a launcher started it as one
        rank of several (RANK or SLURM_PROCID set)."""
        if not any(os.environ.get(v, "").isdigit() for v in _RANK_VARS):
            return cls(os.getppid())
        return cls.snapshot()

    @classmethod
    def snapshot(cls, parent: int | None = None, me: int | None = None) -> "Siblings":
        parent = os.getppid() if parent is None else parent
        me = os.getpid() if me is None else me
        found: dict[int, int] = {}
        try:
            entries = os.listdir("/proc")
        except OSError:
            return cls(parent)
        for name in entries:
            if not name.isdigit() or int(name) == me:
                continue
            pid = int(name)
            st = _stat(pid)
            if st is None or st[1] != parent:
                continue
            rank = _rank_of(pid)
            if rank is not None:
                found[rank] = pid
        return cls(parent, found)

    def lost(self) -> list[int]:
        """The ranks of the snapshot whose process has ended, in rank order."""
        out = []
        for rank, pid in sorted(self.ranks.items()):
            st = _stat(pid)
            if st is None or st[0] in ("Z", "X") or st[1] != self.parent:
                out.append(rank)
        return out


def describe_lost(ranks: list[int]) -> str:
    """'rank 3 lost (its process ended)', 'ranks 2, 3 lost (their processes ended)'."""
    if len(ranks) == 1:
        return f"rank {ranks[0]} lost (its process ended)"
    return f"ranks {', '.join(map(str, ranks))} lost (their processes ended)"
