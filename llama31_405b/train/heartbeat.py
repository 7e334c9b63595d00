"""Which rank stopped answering: one heartbeat file per rank beside the run's MLPerf log.

A rank that stops answering (SIGSTOP, a node frozen in the kernel, a process stuck outside
Python's reach) does not end: its peers' next collective waits for it until the process groups'
timeout (`run.collective_timeout_s`, `train --timeout-s`), then fails with the backend's words
(gloo: "Timed out waiting 60000ms for recv operation to complete"), which name no rank, and the
launcher then lists whichever task ended first. So every rank of a `train` run with an MLPerf log
keeps a heartbeat: a thread that touches `<log folder>/.<log stem>.heartbeat/rank_<r>` (its mtime)
every `interval_for(timeout)` seconds. The thread runs while the main thread waits inside a
collective (gloo and NCCL waits release the GIL) and stops with the process, SIGSTOP included.

- during the run, a rank whose collective timed out names the ranks whose heartbeat is older
  than `stale_after(interval)` while its own is fresh (`stalled`: train.failure puts them in
  run_stop's reason);
- after the run, `launch check-log` (run_and_time.sh's outcome line) names a rank whose last
  heartbeat came well before the others' last (`stopped_first`), which also covers a stopped
  rank 0, whose log then has no run_stop.

A rank that ends normally writes `done` into its file. The folder lies on the filesystem of the
log: on a cluster, the shared LOGDIR every node sees; a node that does not share it sees its own
ranks only. Each file holds `world <N> interval <s>`: files of an earlier, larger run are ignored.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

current: "Heartbeat | None" = None
"""This process's heartbeat, while one runs (read by train.failure)."""


def heartbeat_dir(log_file: str | Path) -> Path:
    log = Path(log_file)
    return log.parent / f".{log.stem}.heartbeat"


def interval_for(timeout_s: float) -> float:
    """A tenth of the collective timeout, between 0.5 s and 60 s: a stopped rank is several
    intervals stale when its peers' collective times out, and 10,000 ranks touch their files
    at most a few hundred times a second."""
    return min(60.0, max(0.5, timeout_s / 10.0))


def stale_after(interval: float) -> float:
    return 3.0 * interval + 1.0


class Heartbeat:
    def __init__(self, folder: str | Path, rank: int, world_size: int, interval: float):
        self.folder, self.rank, self.world = Path(folder), rank, world_size
        self.interval = interval
        self.path = self.folder / f"rank_{rank}"
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Heartbeat":
        """Create the file and beat until `stop`; an unwritable folder leaves the run without a
        heartbeat (its reasons then stay unnamed), never stops it."""
        global current
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.path.write_text(f"world {self.world} interval {self.interval:g}\n")
        except OSError:
            return self
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._thread.start()
        current = self
        return self

    def _beat(self) -> None:
        """Touch the file every interval; a beat that comes more than `stale_after` late means
        this process did not run meanwhile (SIGSTOP, a frozen node): the gap is written into
        the file, so a rank that a launcher resumed (Slurm sends SIGCONT before SIGTERM to a
        stopped task) and ended still shows that it stopped answering."""
        last = time.monotonic()
        while not self._done.wait(self.interval):
            now = time.monotonic()
            try:
                if now - last > stale_after(self.interval):
                    with self.path.open("a") as f:
                        f.write(f"stalled {now - last:.1f}\n")
                os.utime(self.path)
            except OSError:
                pass
            last = now

    def stop(self) -> None:
        global current
        self._done.set()
        if current is self:
            current = None
        if self._thread is None:
            return
        try:
            with self.path.open("a") as f:
                f.write("done\n")
        except OSError:
            pass

    def stalled(self, now: float | None = None) -> list[tuple[int, float]]:
        """(rank, seconds since its last beat) of the ranks that stopped beating, stalest first;
        read by a rank whose collective timed out (its own beat is fresh)."""
        return [(r, age) for r, age, done in _beats(self.folder, now)
                if not done and age > stale_after(self.interval) and r != self.rank]


def _beats(folder: Path, now: float | None = None) -> list[tuple[int, float, bool]]:
    """(rank, seconds since its last beat, ended normally) of the current run's files, stalest
    first."""
    return [(r, age, done) for r, age, done, _ in _records(folder, now)]


def _records(folder: Path, now: float | None = None) -> list[tuple[int, float, bool, float]]:
    """(rank, seconds since its last beat, ended normally, longest stall it recorded) of the
    current run's files, stalest first."""
    now = time.time() if now is None else now
    out, world = [], None
    try:
        files = sorted(folder.glob("rank_*"))
    except OSError:
        return []
    rows = []
    for f in files:
        try:
            rank = int(f.name.removeprefix("rank_"))
            text = f.read_text()
            mtime = f.stat().st_mtime
        except (OSError, ValueError):
            continue
        head = text.split()
        n = int(head[1]) if len(head) >= 2 and head[0] == "world" and head[1].isdigit() else None
        stalls = [float(w) for k, w in zip(head, head[1:]) if k == "stalled"
                  and w.replace(".", "", 1).isdigit()]
        rows.append((rank, now - mtime, "done" in head, n, max(stalls, default=0.0)))
        world = n if world is None else max(world, n or 0)
    for rank, age, done, _, stall in rows:
        if world is None or rank < world:
            out.append((rank, age, done, stall))
    return sorted(out, key=lambda r: -r[1])


def _interval(folder: Path) -> float | None:
    for f in sorted(folder.glob("rank_*")):
        try:
            head = f.read_text().split()
            return float(head[3]) if len(head) >= 4 and head[2] == "interval" else None
        except (OSError, ValueError):
            continue
    return None


def stopped_first(log_file: str | Path) -> str:
    """After a run: 'rank 2 stopped answering first (its last heartbeat 21 s before the other
    ranks' last)', from the run's heartbeat folder; '' when no rank stands out (or no folder)."""
    folder = heartbeat_dir(log_file)
    if not folder.is_dir():
        return ""
    interval = _interval(folder)
    beats = _records(folder)
    if interval is None or len(beats) < 2:
        return ""
    newest = min(age for _, age, _, _ in beats)
    late = [(r, age - newest) for r, age, done, _ in beats
            if not done and age - newest > stale_after(interval)]
    parts = [f"rank {r} (its last heartbeat {gap:.0f} s before the other ranks' last)"
             for r, gap in late]
    # a rank resumed and ended after it stopped (its file fresh again): the stall it recorded,
    # the longest first (a loaded machine can pause another rank's beat for a few seconds too)
    parts += [f"rank {r} ({stall:.0f} s without a heartbeat, then resumed)"
              for r, _, _, stall in sorted(beats, key=lambda b: -b[3])
              if stall > stale_after(interval) and r not in {x for x, _ in late}]
    return ("heartbeats: " + ", ".join(parts) + " stopped answering first") if parts else ""


def describe(ranks: list[tuple[int, float]]) -> str:
    """'rank 2 (no heartbeat for 21 s) stopped answering', several ranks listed stalest first."""
    if not ranks:
        return ""
    parts = [f"rank {r} (no heartbeat for {age:.0f} s)" for r, age in ranks]
    return f"{', '.join(parts)} stopped answering"
