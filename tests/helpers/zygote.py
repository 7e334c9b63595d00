"""Start the ranks of a multi-process test as forks of a process that has already imported torch,
megatron-core and this project: a "zygote" (multiprocessing's forkserver, one per pytest
process, started on first use). A fresh interpreter spends ~6 CPU-seconds importing them
(`import megatron.core` alone pulls torch._dynamo, DTensor and sympy); a fork of the zygote
starts with them imported.

What a rank gets, as under `torchrun --nproc_per_node=N` (torch 2.13) or a fresh `python`:
- its environment: the caller's `os.environ` at the call (plus the repository on PYTHONPATH and
  OMP_NUM_THREADS=1 unless set, as tests/conftest.py's py_env), then, for `launcher="torchrun"`,
  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK,
  ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
  TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, set in the rank before the entry is called
  (`launcher="single"`: none of them, as `python script.py`);
- the working directory `cwd` (default: the repository), `sys.argv = [script, *argv]` and the
  script's folder first on sys.path when the entry is a script (as `python script.py`), its own
  session (so a timeout kills what it started too), stdout/stderr on files of its own;
- one intra-op thread: the zygote is started with OMP_NUM_THREADS=1 in its environment (libgomp
  reads it when torch loads) and every rank calls torch.set_num_threads(1) when OMP_NUM_THREADS
  is 1, as in a fresh interpreter with that variable.

The entry is `"path/to/script.py:function"` (loaded from the file in the rank, under the file's
stem as module name, never in the pytest process: a worker that patches torch at import, as
tests/nvfp4_dist_worker.py does, patches only its ranks) or a module-level function (pickled by
reference). It is called as `function()` (pass_rank=False, torchrun style: the rank reads RANK
from the environment) or `function(rank, *args)` (pass_rank=True, torch.multiprocessing's
start_processes style). A non-zero int returned, a SystemExit or an exception is the rank's
failure.

The call returns a `Result` (returncode, stdout, stderr, ranks) shaped like
subprocess.CompletedProcess, so a test keeps `assert r.returncode == 0, r.stderr[-4000:]`:
on failure `stderr` holds each failed rank's stderr tail (its traceback) and ends with a line
naming the first failed rank, its exit status, and the ranks killed after it. No hang: once a
rank fails the others get GRACE_S to finish, then they are killed (a collective would wait for
the dead rank until its timeout); at `timeout` every rank still running is killed
(returncode 124). `spawn(..., check=True)` raises AssertionError with that text instead.

What it stands for and what it does not:
- the ranks' code, numerics and gloo collectives are the same as under torchrun: same process
  per rank, same environment variables, a TCP rendezvous of their own (MASTER_ADDR/PORT);
- torchrun's elastic agent is NOT exercised: no agent store (TORCHELASTIC_USE_AGENT_STORE is
  not set: rank 0 hosts the TCPStore, as init_method="tcp://..." does anyway), no restarts, no
  per-rank error files, no signal forwarding, no `python -m` of the worker (its `__name__` is
  the file's stem, not "__main__"). Tests ABOUT the launcher (torchrun, run_and_time.sh, the
  CLI, Slurm: tests/test_train_failure.py, test_failures.py, test_launch.py,
  test_profile_run.py, test_check_log.py, the Slurm tests) launch the real command instead;
- modules imported in the zygote were imported once, with the environment of the pytest
  process at the zygote's start (plus OMP_NUM_THREADS=1): a module that reads an environment
  variable at import sees that value, not the rank's. None of PRELOAD does anything
  environment-dependent at import that the tests rely on (megatron-core 0.19.2 reads
  CUDA_GRAPH_CAPTURE_FREEZE_GC and NO_VCS_VERSION at import; transformers and huggingface_hub
  read their HF_* settings at import, and the ranks only load local files; llama31_405b reads
  its variables when called; llama31_405b.cpu_compat patches only when `apply` is called, in
  the rank).
  Warnings emitted at import appear once, on the zygote's stderr, not on every rank's;
- a rank ends with os._exit after flushing stdout/stderr (multiprocessing's forkserver child):
  atexit handlers and interpreter finalisation do not run (a worker writes its results itself);
- the zygote only imports: it never initialises a process group nor runs a parallel torch op, so
  no rank inherits a communicator or a busy OpenMP pool. A zygote already running in the
  pytest process without the preload (someone else started the forkserver first) still works,
  just without the saving: `Result.ranks[i].missing_preload` lists what was not imported.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from .ports import free_port

REPO = Path(__file__).resolve().parents[2]
PRELOAD = [
    "torch", "torch.distributed", "torch.distributed.checkpoint", "torch.multiprocessing",
    "megatron.core", "megatron.core.parallel_state", "megatron.core.models.gpt",
    "megatron.core.distributed", "megatron.core.optimizer", "megatron.core.pipeline_parallel",
    "megatron.core.dist_checkpointing", "megatron.core.full_cuda_graph",
    "llama31_405b.config", "llama31_405b.cpu_compat", "llama31_405b.train.loop",
    "llama31_405b.train.hooks", "llama31_405b.train.evaluation", "llama31_405b.train.warmup",
    "llama31_405b.parallel.setup", "llama31_405b.parallel.placement",
    "llama31_405b.checkpoint.format", "llama31_405b.checkpoint.verify",
    "llama31_405b.checkpoint.read_plan", "llama31_405b.model.builder",
    "llama31_405b.precision.linear", "llama31_405b.precision.nvfp4",
    # the Hugging Face reference of the checkpoint-conversion ranks (a dev dependency)
    "transformers", "transformers.models.llama.modeling_llama",
]
"""Imported once in the zygote (import only: see the module docstring)."""
GRACE_S = 20.0
"""After the first rank fails, how long the others may take to finish before they are killed."""
TAIL = 4000

_ctx = None


@dataclasses.dataclass
class Rank:
    rank: int
    exitcode: int | None           # None: killed by the harness (timeout or after a failure)
    stdout: str
    stderr: str
    missing_preload: list[str]


@dataclasses.dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    ranks: list[Rank]


def _context():
    """The forkserver context, its server started (once per process) with OMP_NUM_THREADS=1."""
    global _ctx
    if _ctx is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            from multiprocessing import forkserver
            forkserver.ensure_running()
        finally:
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        _ctx = ctx
    return _ctx


def base_env(env: dict | None = None) -> dict:
    """The caller's environment as tests/conftest.py's py_env makes it."""
    out = dict(os.environ if env is None else env)
    if env is None:
        out["PYTHONPATH"] = str(REPO) + os.pathsep + out.get("PYTHONPATH", "")
        out.setdefault("OMP_NUM_THREADS", "1")
    return out


def torchrun_env(rank: int, nprocs: int, port: int, addr: str = "127.0.0.1") -> dict:
    """The variables torchrun --nproc_per_node=nprocs (one node, no restarts) gives a rank."""
    return {"RANK": str(rank), "WORLD_SIZE": str(nprocs), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(nprocs), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nprocs), "ROLE_NAME": "default",
            "MASTER_ADDR": addr, "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none"}


def _child(entry, args, pass_rank: bool, rank: int, env: dict, cwd: str, logs: str) -> None:
    """A rank, in a fork of the zygote."""
    os.setsid()
    missing = [m for m in PRELOAD if m not in sys.modules]
    out = os.open(f"{logs}/{rank}.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(f"{logs}/{rank}.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out, 1)
    os.dup2(err, 2)
    Path(f"{logs}/{rank}.pre").write_text(json.dumps(missing))
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if env.get("OMP_NUM_THREADS") == "1" and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    if isinstance(entry, str):
        path, func = entry.rsplit(":", 1)
        sys.argv = [path, *[str(a) for a in args]] if not pass_rank else [path]
        sys.path.insert(0, os.path.dirname(path))
        name = Path(path).stem
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        fn = getattr(mod, func)
    else:
        fn = entry
    try:
        rc = fn(rank, *args) if pass_rank else fn()
    except BaseException as e:  # an exit with status 0 is no failure
        if not (isinstance(e, SystemExit) and e.code in (None, 0)):
            _mark_failed(logs, rank)
        raise
    if isinstance(rc, int) and not isinstance(rc, bool) and rc != 0:
        _mark_failed(logs, rank)
        sys.exit(rc)


def _mark_failed(logs: str, rank: int) -> None:
    """When a rank failed, on the system-wide monotonic clock: which rank failed first is the
    earliest such time, not the first exit the harness sees (a peer that sees the failing rank's
    sockets close can exit before that rank's own teardown ends)."""
    Path(f"{logs}/{rank}.failed").write_text(repr(time.monotonic()))


def _kill(p) -> None:
    for kill in (lambda: os.killpg(p.pid, signal.SIGKILL), lambda: os.kill(p.pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return ""


def spawn(entry, args=(), nprocs: int = 1, *, pass_rank: bool = True, launcher: str = "torchrun",
          env: dict | None = None, cwd: str | os.PathLike = REPO, timeout: float = 600,
          port: int | None = None, check: bool = False) -> Result:
    """Run `entry` on `nprocs` ranks forked from the zygote (see the module docstring)."""
    if launcher not in ("torchrun", "single"):
        raise ValueError(f"launcher must be 'torchrun' or 'single', not {launcher!r}")
    if launcher == "single" and nprocs != 1:
        raise ValueError("launcher='single' runs one process")
    if isinstance(entry, (str, os.PathLike)):       # the script's path, from the caller's cwd
        path, func = str(entry).rsplit(":", 1)
        entry = f"{os.path.abspath(path)}:{func}"
    ctx = _context()
    env = base_env(env)
    port = port or free_port()
    logs = tempfile.mkdtemp(prefix="zygote-")
    procs = []
    first_fail, killed, timed_out = None, [], False
    try:
        for r in range(nprocs):
            renv = dict(env, **(torchrun_env(r, nprocs, port) if launcher == "torchrun" else {}))
            p = ctx.Process(target=_child, name=f"rank{r}",
                            args=(entry, tuple(args), pass_rank, r, renv, str(cwd), logs))
            p.start()
            procs.append(p)
        deadline = time.monotonic() + timeout
        while any(p.exitcode is None for p in procs):
            alive = [p for p in procs if p.exitcode is None]
            multiprocessing.connection.wait([p.sentinel for p in alive], timeout=1.0)
            now = time.monotonic()
            for r, p in enumerate(procs):
                if p.exitcode not in (None, 0) and first_fail is None:
                    first_fail = (r, now)
            late = first_fail is not None and now - first_fail[1] > GRACE_S
            if late or now > deadline:
                timed_out = first_fail is None
                for r, p in enumerate(procs):
                    if p.exitcode is None:
                        killed.append(r)
                        _kill(p)
                for p in procs:
                    p.join()
                break
    finally:
        for p in procs:
            if p.exitcode is None:
                _kill(p)
                p.join()
        marks = {r: float(t) for r in range(len(procs)) if (t := _read(f"{logs}/{r}.failed"))}
        marked = [r for r in marks if r not in killed and procs[r].exitcode not in (None, 0)]
        if first_fail is not None and marked:
            first_fail = (min(marked, key=lambda r: marks[r]), first_fail[1])
        ranks = [Rank(r, None if r in killed else procs[r].exitcode, _read(f"{logs}/{r}.out"),
                      _read(f"{logs}/{r}.err"),
                      json.loads(_read(f"{logs}/{r}.pre") or "[]")) for r in range(len(procs))]
        shutil.rmtree(logs, ignore_errors=True)
    name = entry if isinstance(entry, str) else f"{entry.__module__}.{entry.__qualname__}"
    return _result(name, ranks, first_fail, killed, timed_out, timeout, check)


def _status(code) -> str:
    if code is None:
        return "killed by the harness"
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def _result(entry, ranks, first_fail, killed, timed_out, timeout, check) -> Result:
    stdout = "".join(r.stdout for r in ranks)
    failed = [r for r in ranks if r.exitcode != 0 and r.exitcode is not None]
    if timed_out:
        rc = 124
        summary = (f"zygote: {entry} timed out after {timeout:.0f} s: ranks {killed} still "
                   f"running, killed")
        shown = [ranks[r] for r in killed]
    elif first_fail is not None:
        first = ranks[first_fail[0]]
        rc = first.exitcode if first.exitcode > 0 else 128 - first.exitcode
        summary = (f"zygote: {entry}: rank {first.rank} failed first ({_status(first.exitcode)})"
                   + (f"; also failed: {[(r.rank, _status(r.exitcode)) for r in failed if r is not first]}"
                      if len(failed) > 1 else "")
                   + (f"; killed {GRACE_S:.0f} s after it: ranks {killed}" if killed else ""))
        # the first failure's traceback last, so that stderr[-4000:] shows it
        shown = [r for r in failed if r is not first] + [first]
    else:
        rc, summary, shown = 0, "", []
    if rc == 0:
        stderr = "".join(r.stderr for r in ranks)
    else:
        stderr = "".join(f"--- rank {r.rank} ({_status(r.exitcode)}), end of stderr ---\n"
                         f"{r.stderr[-TAIL:]}\n" for r in shown) + summary + "\n"
    res = Result(rc, stdout, stderr, ranks)
    if check:
        assert res.returncode == 0, res.stderr[-3 * TAIL:]
    return res


def run_script(script, argv=(), nprocs: int = 1, *, func: str = "main", **kw) -> Result:
    """`python script.py ARGV...` (nprocs=1, launcher="single") or `torchrun
    --nproc_per_node=nprocs script.py ARGV...`, as ranks of the zygote: `func()` of the script
    with sys.argv set; its int return value is the exit status."""
    kw.setdefault("launcher", "torchrun" if nprocs > 1 else "single")
    return spawn(f"{script}:{func}", tuple(str(a) for a in argv), nprocs, pass_rank=False, **kw)
