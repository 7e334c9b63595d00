"""What each test of the suite costs in CPU, from a run with `--cpu-times FILE`
(tests/conftest_cpu_times.py): per test and per test file, the CPU seconds (pytest's process and
its ended children) and the wall seconds, the largest first, with each one's share of the run's
CPU. The CPU total over the cores is the least wall time the suite can take.

    make test ARGS=--cpu-times=/tmp/cpu.jsonl      # `=`: a path given apart is read as a test path
    .venv/bin/python bench/test_cpu_times.py /tmp/cpu.jsonl [--top 40] [--cores 2]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def load(path: Path) -> list[dict]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            sys.exit(f"{path}:{n}: not a JSON line (was the file written by --cpu-times?)")
    return out


def totals(rows: list[dict], key) -> list[tuple[str, float, float]]:
    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    for r in rows:
        cpu[key(r)] += r["cpu_s"]
        wall[key(r)] += r["wall_s"]
    return sorted(((k, cpu[k], wall[k]) for k in cpu), key=lambda t: -t[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--cores", type=int, default=2)
    a = ap.parse_args(argv)
    rows = load(a.file)
    if not rows:
        sys.exit(f"{a.file}: no test recorded")
    total = sum(r["cpu_s"] for r in rows)
    print(f"{len({r['test'] for r in rows})} tests, {total:.0f} CPU s in all: at least "
          f"{total / a.cores:.0f} s of wall time on {a.cores} cores")
    spans = [r for r in rows if "start" in r]
    if spans:     # when each worker ran tests: busy wall time against its first start to last end
        print(f"\n{'busy s':>8} {'span s':>8}  worker (busy: its tests' wall time; span: first "
              "start to last end)")
        for wk in sorted({r["worker"] for r in spans}):
            mine = [r for r in spans if r["worker"] == wk]
            span = max(r["start"] + r["wall_s"] for r in mine) - min(r["start"] for r in mine)
            print(f"{sum(r['wall_s'] for r in mine):8.0f} {span:8.0f}  {wk}")
    for title, key in (("test file", lambda r: r["test"].split("::")[0]),
                       ("test (setup + call + teardown)", lambda r: r["test"])):
        print(f"\n{'CPU s':>8} {'share':>6} {'wall s':>8}  {title}")
        for k, c, w in totals(rows, key)[:a.top]:
            print(f"{c:8.1f} {c / total:6.1%} {w:8.1f}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
