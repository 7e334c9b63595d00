"""The rehearsal's child processes as forks of one process that imported torch and megatron-core
once (Python's multiprocessing forkserver with those modules preloaded).

A fresh interpreter spends ~5 CPU-seconds importing torch and megatron-core (which pulls in
torch._dynamo, DTensor and sympy) before a rank does any work; a rehearsal of 64 ranks paid
that 64 times. A fork of the preloaded server starts with the modules imported and nothing
else: no process group, no parallel state, no model (the server runs no project code beyond
imports), so every rank still starts from a clean slate, as a new process would.

The server is started here, with the children's environment (no CUDA device, one OpenMP thread)
in place while it imports, so the imports see what a child would. When this process already
runs a forkserver (started by someone else with another environment), the children are plain
`python -m` processes instead.
"""
from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import sys
import traceback
from contextlib import contextmanager

PRELOAD = ["torch", "torch.distributed", "megatron.core", "megatron.core.parallel_state",
           "megatron.core.models.gpt", "megatron.core.distributed", "megatron.core.optimizer",
           "llama31_405b.rehearse.rank", "llama31_405b.rehearse.dataset"]
"""What each child would import anyway (rehearse/rank.py's phases, rehearse/dataset.py)."""


@contextmanager
def _environ(env: dict[str, str]):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _server_running() -> bool:
    from multiprocessing import forkserver
    return getattr(forkserver._forkserver, "_forkserver_pid", None) is not None


class Forks:
    """Start `module.main(argv)` in a fork with stdout and stderr in a log file. `None` from
    `start` when no fork server of ours can be had (the caller then uses a subprocess)."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.ctx = None
        if sys.platform != "linux" or _server_running():
            return
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        keep = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "PYTHONPATH", "PYTHONWARNINGS")
        child_env: dict[str, str] = {k: env[k] for k in keep if k in env}
        with _environ(child_env):
            from multiprocessing import forkserver
            forkserver.ensure_running()
        self.ctx = ctx

    def start(self, module: str, argv: list[str], log: str):
        if self.ctx is None:
            return None
        p = self.ctx.Process(target=_child, args=(module, argv, log, self.env))
        p.start()
        return p


def _child(module: str, argv: list[str], log: str, env: dict[str, str]) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.update(env)
    rc = 1
    try:
        rc = importlib.import_module(module).main(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(rc or 0)
