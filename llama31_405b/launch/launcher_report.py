"""What the launcher reported about a run's processes, in one phrase for run_and_time.sh's outcome
line ("launcher (torchrun): rank 1 (pid 4242) killed by SIGKILL"): which task ended first and how,
read from the console of the run (the launcher's stderr, which run_and_time.sh keeps as
console_<i>.txt beside the MLPerf log).

- torchrun (torch 2.13, `torch.distributed.elastic.multiprocessing.errors.ChildFailedError.
  format_msg`): a block per failed rank, "Root Cause (first observed failure):" then
  `rank      : R (local_rank: L)` and `exitcode  : C (pid: P) [SIGNAL]`; a negative exit code is the
  signal that ended the process.
- torchrun stopped by a signal itself (scancel, Ctrl-C: `torch.distributed.elastic.
  multiprocessing.api.SignalException`, raised by its `_terminate_process_handler`):
  `...SignalException: Process P got signal: S`, S the signal's number.
- srun (Slurm): `srun: error: NODE: task(s) LIST: Killed | Terminated | Exited with exit code C |
  <other signal description>`, in the order srun noticed them; the first is the first cause it
  knows.

The MLPerf log says why the run itself stopped (a signal, a lost rank); this says what the
launcher saw, which for a rank killed with SIGKILL is the only record of which rank it was.
"""
from __future__ import annotations

import re
import signal
from pathlib import Path

_SRUN = re.compile(r"srun: error: (?P<node>[^:\s]+): (?P<tasks>tasks? [\d,\-\[\]]+): (?P<what>.+)$")
_TR_RANK = re.compile(r"^\s*rank\s*:\s*(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)")
_TR_EXIT = re.compile(r"^\s*exitcode\s*:\s*(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)")
_TR_SIGNAL = re.compile(r"SignalException: Process (?P<pid>\d+) got signal: (?P<sig>\d+)")


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _torchrun(lines: list[str]) -> str:
    """The root cause of torchrun's failure report, and how many other ranks failed."""
    try:
        root = max(i for i, ln in enumerate(lines) if "Root Cause (first observed failure)" in ln)
    except ValueError:
        return ""
    failed = sum(1 for ln in lines if _TR_RANK.match(ln)) - 1
    rank = code = None
    for ln in lines[root:]:
        rank = rank or _TR_RANK.match(ln)
        code = code or _TR_EXIT.match(ln)
        if rank and code:
            break
    if not (rank and code):
        return ""
    c = int(code["code"])
    how = f"killed by {_signame(-c)}" if c < 0 else f"exited with code {c}"
    more = f"; {failed} other rank(s) failed after it" if failed > 0 else ""
    return f"launcher (torchrun): rank {rank['rank']} (pid {code['pid']}) {how} first{more}"


def _torchrun_signalled(lines: list[str]) -> str:
    """torchrun itself stopped by a signal (it then stops every rank)."""
    hits = [m for ln in lines if (m := _TR_SIGNAL.search(ln))]
    if not hits:
        return ""
    m = hits[0]
    return (f"launcher (torchrun): stopped by {_signame(int(m['sig']))} (pid {m['pid']}), "
            "which it passed to every rank")


def _srun(lines: list[str]) -> str:
    hits = [m for ln in lines if (m := _SRUN.search(ln.strip()))]
    if not hits:
        return ""
    first = hits[0]
    rest = [f"{m['tasks']}: {m['what'].strip()}" for m in hits[1:]]
    return (f"launcher (srun): {first['tasks']} on {first['node']}: {first['what'].strip()} first"
            + (f"; then {'; '.join(rest)}" if rest else ""))


def launcher_report(text: str) -> str:
    """One phrase: what the launcher reported (torchrun's root cause, or srun's task errors in
    order); '' when it reported no failed task."""
    lines = text.splitlines()
    return _torchrun(lines) or _torchrun_signalled(lines) or _srun(lines)


def read_launcher_report(path: str | Path | None) -> str:
    if not path:
        return ""
    try:
        return launcher_report(Path(path).read_text(errors="replace"))
    except OSError:
        return ""
