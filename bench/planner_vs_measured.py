"""The planner calibrated on measured profiles, against layouts it did not see (issues 39, 46).

The proof is fixed in bench/planner_proof.toml before anything is measured under it: its
layouts, which of them each section fits and which it predicts, the rounds, the profiled steps
and the tolerances (step 15 %, each component 25 % unless under 5 % of the step), and the
core-share pairs (a 2-rank layout and the 4-rank layout with a second replica of it). The bench
profiles every layout of the proof with the tiny model (`python -m llama31_405b profile` under
torchrun, gloo, as many ranks as the layout has) in the proof's rounds (each round the fit layouts
first, then the others, in reverse order every other round, so that a drift of the machine meets
every layout alike), recording the 1-minute load average before and after every profile, and the
machine's speed: a fixed one-thread GEMM loop timed before and after every profile (speed.json;
the table's "machine" column, each layout's slowest and fastest reference against the run's
median). A VM's cores slowed by a busy host show there and not in its load average: of two runs
on a quiet machine, the machine column stays near 1.00 in both. A profile around which the
reference took over `DISTURBED` x the run's baseline (its median of five timings before the first
profile) is profiled again, at most `RETRIES` times: the slow attempt's folder is kept beside
the others (profile_<layout>_r<round>.disturbed<k>) and listed in retries.json, which the table
prints under its rows (from run 2026-12-06T0424Z on; the earlier ones kept every first attempt).

It writes the summaries behind the table into a new folder meant for committing (default
docs/planner_proof/<UTC date and time>; an existing one is refused, naming it): each layout's
config and each round's summary (bench/planner_proof/summaries.py), then derives the table from
that folder alone (bench/planner_proof/derive.py: `plan --calibrate` on each section's fit
layouts, `predict` for every layout of the section) and writes the calibration files,
table.json and table.md there; the published table holds exactly the proof's layouts.
tests/test_planner_proof.py re-derives a committed folder's table of the current model revision
in `make test`.

    PYTHONPATH=$PWD .venv/bin/python bench/planner_vs_measured.py [--proof FILE] [--out RUN]
        [--work DIR] [--reuse]
    ... --derive RUN            re-derive RUN's table from its summaries, print it, and exit 1
                                where it differs from RUN/table.json (no profiling); exit 2
                                for a table of another model revision (its commit named)
    ... --derive DIR --calibration CAL
                                an --extra folder's layouts predicted from another
                                calibration CAL (of this model revision), printed, nothing
                                written: a diagnosis of how much a prediction owes to the run
                                its calibration came from, never the folder's own report
    ... [--beside SECTION=FILE ...]
                                a proof run that also profiles the [layouts] of each FILE in
                                its own rounds, interleaved with the proof's (as its unseen
                                layouts are), and predicts them from the run's calibration of
                                SECTION: each reported apart, in a folder of the --extra kind
                                beside the run's (extra_<run>_<SECTION>), never in the
                                published table. The set and the calibration then see the
                                same machine: a set predicted from another run's calibration
                                reads that run's drift (docs/planner.md, "What revision 22
                                leaves")
    ... --extra FILE --calibration CAL [--out DIR]
                                profile the [layouts] of FILE (the proof file's format) and
                                predict them from CAL: reported apart (extra.md, extra.json in
                                DIR, with what re-derives them), never in the published table;
                                `--derive DIR` re-derives such a folder as it does a run's table

The first run writes the tiny data and both initial checkpoints into --work (a few minutes);
--reuse summarises the profile folders a previous run left in --work instead of profiling again.
Never part of `make test`. 18-19 minutes on the quiet 2-core machine (2026-12-05: 9 layouts, 3
rounds, the two initial checkpoints included; docs/planner_proof/2026-12-05T0308Z and T0440Z);
21 and 29 minutes with 4 and 15 profiles taken again (2026-12-06T0424Z, T0459Z). Under the
fourth proof file (16 profiled steps) 16 minutes, none taken again, on the faster machine of
2026-12-06 evening (AVX512; docs/planner_proof/2026-12-06T2132Z, T2150Z). With five layouts
beside it (`--beside`) on an AVX2 machine, 77 minutes (docs/planner_proof/2026-12-07T1957Z: the
GB200 settings' BF16 profiles 106-180 s each); 72 minutes for the next
(docs/planner_proof/2026-12-07T2253Z).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")

from bench.planner_proof import derive, render, spec, summaries  # noqa: E402
from bench.planner_proof.rederive import diagnose_extra, rederive, rederive_extra  # noqa: E402,F401


def _run(cmd: list[str], log: Path) -> None:
    with log.open("w") as f:
        r = subprocess.run(cmd, cwd=ROOT, env=ENV, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{log.read_text()[-3000:]}")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(work: Path) -> None:
    """Tiny data and the two initial checkpoints (tiny_cpu's, tiny_cpu_gb200's) in `work`."""
    for name, base in spec.BASES.items():
        (work / f"base_{name}.toml").write_text(
            f'base = "{ROOT / "configs" / base}"\n\n[data]\ndata_dir = "{work / "data"}"\n\n'
            f'[checkpoint]\nckpt_dir = "{work / "ckpt"}"\n')
    if (work / "ckpt" / "tiny-init").exists() and (work / "ckpt" / "tiny-gb200-init").exists():
        return
    from llama31_405b.data.tiny import ensure_tiny_data
    ensure_tiny_data(work / "data")
    py = [sys.executable, "-m"]
    _run([*py, "llama31_405b", "train-init", "--config", str(work / "base_tiny.toml")],
         work / "init.log")
    _run([*py, "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m", "llama31_405b",
          "train-init", "--config", str(work / "base_gb200.toml")], work / "init_gb200.log")


def reference_ms(reps: int = 3) -> float:
    """The machine's speed now: the median of `reps` timings (ms) of one fixed FP32 GEMM loop
    on one thread (about 60 ms each on the 2-core development machine)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a = torch.full((256, 256), 0.5)
    try:
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            for _ in range(150):
                a @ a
            times.append((time.perf_counter() - t) * 1e3)
    finally:
        torch.set_num_threads(threads)
    return sorted(times)[len(times) // 2]


RECORDS = derive.RECORDS
"""The work folder's records per profile ("<layout>/r<round>"): the 1-minute load average and
the reference GEMM's time (`reference_ms`), each before and after the profile; the attempts
profiled again (`disturbed`), each with its reference times, the baseline and its kept folder."""
DISTURBED = 1.15
"""A profile is disturbed when its reference GEMM, before or after it, took over this times the
run's baseline: the runs of 2026-12-06 read 0.97-1.10 around most profiles and 1.16-1.44 around
one in eight, the slowest first round of PP2 x VP2 x DP2 among them (1.41, 1.24)."""
RETRIES = 2


def disturbed(speed: list[float], baseline: float) -> bool:
    """Whether a profile with reference times `speed` (before, after) ran on a slowed machine."""
    return max(speed) > DISTURBED * baseline


def baseline_ms(reps: int = 5) -> float:
    """The run's baseline: the median of `reps` reference timings (`reference_ms`)."""
    times = sorted(reference_ms() for _ in range(reps))
    return times[len(times) // 2]


def _record(work: Path, name: str, key: str, value: list[float]) -> None:
    records = derive.read_records(work, name)
    records[key] = value
    (work / name).write_text(json.dumps(records, indent=1))


def _profile_once(work: Path, layout: spec.Layout, rnd: int, steps: int, out: Path,
                  log: Path) -> tuple[list[float], list[float]]:
    """One profile of `layout` into `out`: (load averages, reference times), before and after."""
    s0 = reference_ms()
    t0, l0 = time.perf_counter(), os.getloadavg()[0]
    _run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={layout.ranks}",
          f"--master_port={_port()}", "--master_addr=127.0.0.1", "-m", "llama31_405b", "profile",
          str(spec.work_config(layout, work)), "--out", str(out), "--ranks", "all", "--skip", "1",
          "--baseline", "1", "--steps", str(steps)], log)
    l1, dt = os.getloadavg()[0], time.perf_counter() - t0
    s1 = reference_ms()
    print(f"  round {rnd}: profiled {layout.name} in {dt:.0f} s (load average {l0:.1f} -> "
          f"{l1:.1f}; reference GEMM {s0:.0f} -> {s1:.0f} ms)", flush=True)
    return [l0, l1], [s0, s1]


def profile(work: Path, layout: spec.Layout, rnd: int, steps: int,
            baseline: float | None = None, once=_profile_once) -> Path:
    """Profile `layout` in round `rnd` into work/profile_<name>_r<rnd>, recording the load
    averages and the reference GEMM's time around it (`RECORDS`); with a `baseline`, a
    `disturbed` attempt is moved to profile_<name>_r<rnd>.disturbed<k> (kept, listed in
    retries.json) and the layout profiled again, at most `RETRIES` times."""
    key, out = f"{layout.name}/r{rnd}", work / f"profile_{layout.name}_r{rnd}"
    taken = [p for p in (out, *out.parent.glob(f"{out.name}.disturbed*")) if p.exists()]
    if taken:
        sys.exit(f"{taken[0]} exists: a profile folder is never overwritten (use another "
                 "--work, or --reuse to summarise it)")
    for attempt in range(1, RETRIES + 2):
        log = work / f"profile_{layout.name}_r{rnd}.log"
        loads, speed = once(work, layout, rnd, steps, out, log)
        if baseline is None or not disturbed(speed, baseline) or attempt > RETRIES:
            break
        kept = out.with_name(f"{out.name}.disturbed{attempt}")
        out.rename(kept)
        log.rename(kept.with_name(kept.name + ".log"))
        tries = derive.read_records(work, "retries.json").get(key, [])
        _record(work, "retries.json", key, [*tries, {"speed": speed, "load": loads,
                                                     "baseline": baseline,
                                                     "kept": kept.name}])
        print(f"  round {rnd}: {layout.name} profiled again: the reference GEMM took "
              f"{max(speed) / baseline:.2f} x the baseline ({kept.name} kept)", flush=True)
    _record(work, "loads.json", key, loads)
    _record(work, "speed.json", key, speed)
    return out


def order(names: list[str], fits: list[str], rnd: int) -> list[str]:
    """The fit layouts first in every round, the others forward in odd rounds, reversed in even."""
    others = [n for n in names if n not in fits]
    return [n for n in names if n in fits] + (others if rnd % 2 else others[::-1])


def profile_all(work: Path, layouts: dict, names: list[str], fits: list[str], rounds: int,
                steps: int, reuse: bool) -> None:
    """Every layout in every round (or, with `reuse`, the folders already in `work`)."""
    if not reuse:
        setup(work)
        baseline = baseline_ms()
        print(f"  the machine's baseline: reference GEMM {baseline:.0f} ms (a profile around "
              f"which it takes over {DISTURBED} x that is profiled again)", flush=True)
        for r in range(1, rounds + 1):
            for n in order(names, fits, r):
                profile(work, layouts[n], r, steps, baseline)
    missing = [f"profile_{n}_r{r}" for n in names for r in range(1, rounds + 1)
               if not (work / f"profile_{n}_r{r}" / "analysis.json").is_file()]
    if missing:
        sys.exit(f"no profile {work / missing[0]} (run without --reuse)")


def summarise(work: Path, run: Path, layouts: dict, names: list[str], rounds: int) -> None:
    for n in names:
        spec.committed_config(layouts[n], run / "layouts" / n)
        for r in range(1, rounds + 1):
            summaries.reduce_profile(work / f"profile_{n}_r{r}", summaries.round_folder(run, n, r))
    for name in RECORDS:   # those of these layouts, where the work folder has them
        if (work / name).exists():
            keep = {k: v for k, v in derive.read_records(work, name).items()
                    if k.split("/")[0] in names}
            (run / name).write_text(json.dumps(keep, indent=1) + "\n")


def _commit() -> dict:
    def git(*a: str) -> str:
        r = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def _cpu() -> dict:
    """The CPU the profiles ran on: its model and the SIMD level torch uses (a CPU without BF16
    units, AVX2, runs the gb200 layout's BF16 GEMMs some 20 x slower than FP32 ones)."""
    import torch
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
                 "") if Path("/proc/cpuinfo").is_file() else ""
    return {"cpu_model": model, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def beside_sets(proof: spec.Proof, items: list[str]) -> list[tuple[str, Path, dict]]:
    """`--beside SECTION=FILE`: (section, file, its layouts) each, refused before any work
    where SECTION is not one of the proof's, a layout's name is already taken (by the proof file
    or another FILE), or a layout has another rank count than every unseen layout of SECTION
    (a set meant for the other section)."""
    sections = {s.name: s for s in proof.sections}
    taken, out = set(proof.layouts), []
    for item in items:
        name, _, path = item.partition("=")
        if name not in sections or not path:
            sys.exit(f"--beside {item!r}: give SECTION=FILE, SECTION one of the proof's "
                     f"sections ({', '.join(sections)})")
        try:
            layouts = spec.load_layouts(Path(path))
        except (OSError, ValueError) as e:
            sys.exit(f"--beside {item!r}: {e}")
        ranks = {proof.layouts[n].ranks for n in sections[name].unseen}
        for n, lay in layouts.items():
            if n in taken:
                sys.exit(f"{path}: layout {n!r} is already named by the proof file or another "
                         "--beside file: rename it")
            if lay.ranks not in ranks:
                sys.exit(f"{path}: layout {n!r} has {lay.ranks} ranks, section {name}'s unseen "
                         f"layouts {sorted(ranks)}: give it to the section of its rank count")
        taken |= set(layouts)
        out.append((name, Path(path), layouts))
    return out


def _extra_head(out: Path, proof: spec.Proof, layouts_file: Path) -> None:
    """An --extra kind folder's copies of the proof file and the layouts file it ran under."""
    (out / "proof.toml").write_text(proof.text)
    shutil.copyfile(layouts_file, out / "layouts.toml")


def _extra_report(out: Path, layouts_file: str, calibration: str) -> None:
    """An --extra kind folder's report (extra.json, extra.md) from its summaries and its
    calibration/given.toml (`derive.derive_extra`), printed."""
    t = derive.derive_extra(out, layouts_file, calibration)
    (out / "extra.json").write_text(json.dumps(t, indent=1) + "\n")
    (out / "extra.md").write_text(render.extra_markdown(t))
    print(render.extra_markdown(t) + f"\nWritten: {out}")


def _beside_path(run: Path, sec: str) -> Path:
    return run.parent / f"extra_{run.name}_{sec}"


def _beside_folder(run: Path, proof: spec.Proof, sec: str, path: Path, layouts: dict) -> Path:
    """The new folder of a set profiled beside `run` (refused where it exists), holding its
    layouts file, the proof file and each layout's committed config, which must load."""
    from llama31_405b.config.load import load_config
    out = summaries.new_folder(_beside_path(run, sec))
    _extra_head(out, proof, path)
    for n, lay in layouts.items():
        load_config(spec.committed_config(lay, out / "layouts" / n))
    return out


def _rel(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def beside_report(run: Path, work: Path, folder: Path, sec: str, path: Path, layouts: dict,
                  rounds: int, info: dict) -> None:
    """A set profiled beside `run`: summarised into `folder` and predicted from the run's
    calibration of `sec` (copied as calibration/given.toml), as an --extra folder."""
    cal = run / "calibration" / f"{sec}.toml"
    summarise(work, folder, layouts, list(layouts), rounds)
    (folder / "run.json").write_text(json.dumps(info | {"beside": run.name}, indent=1) + "\n")
    if not cal.is_file():
        print(f"{folder}: section {sec} has no calibration (table.md says why): the set is "
              "summarised, not predicted")
        return
    (folder / "calibration").mkdir()
    shutil.copyfile(cal, folder / "calibration" / "given.toml")
    _extra_report(folder, _rel(path), _rel(cal))


def proof_run(a) -> None:
    proof = spec.load(a.proof)
    sets = beside_sets(proof, getattr(a, "beside", None) or [])
    commit = _commit()   # before this run writes anything (the sets' folders get files at once)
    run = Path(a.out or ROOT / "docs" / "planner_proof" /
               time.strftime("%Y-%m-%dT%H%MZ", time.gmtime()))
    summaries.refuse_existing(*[_beside_path(run, sec) for sec, _, _ in sets])
    summaries.new_folder(run)
    folders = [_beside_folder(run, proof, sec, path, lay) for sec, path, lay in sets]
    work = a.work or Path(tempfile.mkdtemp(prefix="planner_vs_measured_"))
    work.mkdir(parents=True, exist_ok=True)
    info = {"started": _now(), "cpus": os.cpu_count(), "load_before": os.getloadavg()[0],
            "work": str(work), **_cpu(), **commit}
    print(f"summaries folder {run}; work folder {work}; load average {info['load_before']:.1f} "
          f"on {info['cpus']} CPUs; {info['started']}", flush=True)
    (run / "proof.toml").write_text(proof.text)
    names = proof.profiled
    layouts = dict(proof.layouts)
    for _, _, lay in sets:
        layouts |= lay
    profile_all(work, layouts, [*names, *[n for _, _, lay in sets for n in lay]], proof.fits,
                proof.rounds, proof.steps, a.reuse)
    summarise(work, run, proof.layouts, names, proof.rounds)
    info.update(finished=_now(), load_after=os.getloadavg()[0])
    (run / "run.json").write_text(json.dumps(info, indent=1) + "\n")
    table = derive.derive(run, run / "calibration")
    (run / "table.json").write_text(json.dumps(table, indent=1) + "\n")
    (run / "table.md").write_text(render.markdown(table))
    print(render.markdown(table))
    for folder, (sec, path, lay) in zip(folders, sets):
        beside_report(run, work, folder, sec, path, lay, proof.rounds, info)
    print(f"Load average {info['load_before']:.1f} before, {info['load_after']:.1f} after "
          f"({info['finished']}). Written: {run}")


def extra(a) -> None:
    """Layouts outside the proof, profiled and predicted from a given calibration, apart. The
    folder keeps what re-derives extra.json without profiling (`--derive FOLDER`): the layouts
    file and the proof file it ran under, the given calibration, the summaries, the loads, and
    run.json (the commit, the CPU, the load before and after)."""
    from llama31_405b.planner import calibrate
    if not a.calibration:
        sys.exit("--extra needs --calibration FILE (the calibration to predict them from)")
    proof, cal = spec.load(a.proof), calibrate.read(a.calibration)
    table = Path(a.calibration).resolve().parent.parent / "table.json"
    rev = json.loads(table.read_text()).get("model_revision", 1) if table.is_file() else None
    if rev is not None and rev != calibrate.MODEL_REVISION:
        sys.exit(f"{a.calibration} was fitted by model revision {rev} (its run's table.json); "
                 f"this code is revision {calibrate.MODEL_REVISION}, which reads its constants "
                 "otherwise: use a calibration of a run of this revision")
    layouts = spec.load_layouts(a.extra)
    # the tree's state before this run writes anything: the folder's own files (the configs
    # below) would make a clean checkout read "dirty" (every extra folder before 2026-12-06)
    commit = _commit()
    out = summaries.new_folder(a.out or Path(tempfile.mkdtemp(prefix="planner_extra_")) / "extra")
    work = a.work or Path(tempfile.mkdtemp(prefix="planner_vs_measured_"))
    work.mkdir(parents=True, exist_ok=True)
    names = list(layouts)
    from llama31_405b.config.load import load_config
    bad = [x for n in names for x in calibrate.mismatches(
        cal, load_config(spec.committed_config(layouts[n], out / "layouts" / n)))]
    if bad:
        sys.exit("\n".join(bad))
    info = {"started": _now(), "cpus": os.cpu_count(), "load_before": os.getloadavg()[0],
            "work": str(work), **_cpu(), **commit}
    _extra_head(out, proof, a.extra)
    (out / "calibration").mkdir()
    shutil.copyfile(a.calibration, out / "calibration" / "given.toml")
    profile_all(work, layouts, names, [], proof.rounds, proof.steps, a.reuse)
    summarise(work, out, layouts, names, proof.rounds)
    info.update(finished=_now(), load_after=os.getloadavg()[0])
    (out / "run.json").write_text(json.dumps(info, indent=1) + "\n")
    _extra_report(out, str(a.extra), str(a.calibration))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--proof", type=Path, default=spec.PROOF, help="the proof file")
    ap.add_argument("--out", type=Path, help="the new summaries folder (never overwritten)")
    ap.add_argument("--work", type=Path, help="work folder (default: a new temporary one)")
    ap.add_argument("--reuse", action="store_true", help="summarise the profiles in --work")
    ap.add_argument("--derive", type=Path, metavar="RUN",
                    help="re-derive RUN's table (or an --extra folder's)")
    ap.add_argument("--extra", type=Path, metavar="FILE", help="layouts outside the proof")
    ap.add_argument("--beside", action="append", metavar="SECTION=FILE",
                    help="with a proof run: also profile FILE's layouts in its rounds and "
                         "predict them from its SECTION calibration, reported apart")
    ap.add_argument("--calibration", type=Path,
                    help="with --extra: the calibration to use; with --derive DIR: predict the "
                         "--extra folder DIR from it instead (printed only)")
    a = ap.parse_args()
    if a.reuse and not a.work:
        sys.exit("--reuse needs --work DIR")
    if a.beside and (a.extra or a.derive):
        sys.exit("--beside belongs to a proof run: not with --extra or --derive")
    if a.derive:
        sys.exit(diagnose_extra(a.derive, a.calibration) if a.calibration
                 else rederive(a.derive))
    try:
        extra(a) if a.extra else proof_run(a)
    except FileExistsError as e:
        sys.exit(str(e))


if __name__ == "__main__":
    main()
