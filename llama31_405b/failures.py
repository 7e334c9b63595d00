"""How every command ends a failure: THE convention, in one place (here; docs/cli.md), for every
command of `python -m llama31_405b` and the training run's own failures (train.loop). A new
command needs nothing: `cli.main` runs it through `run_command`; one that catches its own errors
reports them with `error()` / `fail()` and returns an `EXIT_*` code.

- One line on stderr, `error: <what failed: file, key, rank, tensor; what to do>` (a message that
  lists several problems continues on indented lines). Under a launcher with several ranks, a
  rank other than 0 starts its line with `rank N: `.
- No traceback, unless asked for: `--debug` (before the command: `python -m llama31_405b --debug
  train ...`) or the environment variable `LLAMA31_405B_DEBUG=1` (for launchers that build the
  command line themselves: torchrun, srun, run_and_time.sh).
- The exit status says which kind of failure (`EXIT_*` below; run_and_time.sh and `launch
  check-log` use the same numbers; docs/cli.md has the table, and what 1 and 2 mean per command):

    0  success
    1  the work failed (a run aborted, a check failed, an unexpected error)
    2  bad input: config, arguments, files, checkpoint, data, device (fix the input, rerun)
    3  placement: the job's layout cannot work on these nodes (retrying them is pointless)
    4  `launch check-log` / run_and_time.sh: a log without run_stop (the run was killed)
  130  interrupted (Ctrl-C)

`main()` runs every command through `run_command`, so an exception no command caught still ends
this way. Commands that catch their own errors print with `error()` and return an `EXIT_*` code;
`exit_code(exc)` maps an exception to its kind. Classes are matched by name along the exception's
MRO, so this module imports nothing heavy. Some failures are BaseExceptions on purpose or by
accident (torch's `torch.distributed.checkpoint.api.CheckpointException`, raised by a load whose
tensors do not fit): they are failures like any other here.
"""
from __future__ import annotations

import os
import sys
import traceback

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_PLACEMENT, EXIT_NO_RUN_STOP = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130
DEBUG_ENV = "LLAMA31_405B_DEBUG"

# exception class name -> exit status (the first class of the exception's MRO found here wins)
KINDS = {
    "PlacementError": EXIT_PLACEMENT,
    "ConfigError": EXIT_INPUT, "DeviceError": EXIT_INPUT, "CheckpointError": EXIT_INPUT,
    "HFCheckpointError": EXIT_INPUT, "ConversionError": EXIT_INPUT, "DataError": EXIT_INPUT,
    "LogError": EXIT_INPUT, "RecipeEnvError": EXIT_INPUT, "AllocationError": EXIT_INPUT,
    "PackageError": EXIT_INPUT,   # submission.package refuses its input (logs, config, system)
    "FileNotFoundError": EXIT_INPUT, "FileExistsError": EXIT_INPUT,
    "IsADirectoryError": EXIT_INPUT, "NotADirectoryError": EXIT_INPUT,
    "PermissionError": EXIT_INPUT,
    "KeyboardInterrupt": EXIT_INTERRUPTED,
}
# messages that already say what failed: no class name in front
_PLAIN = {"PlacementError", "ConfigError", "DeviceError", "CheckpointError", "HFCheckpointError",
          "ConversionError", "DataError", "LogError", "RecipeEnvError", "AllocationError",
          "RunAborted", "LogWriteError", "PackageError", "ParallelSetupError", "GpuSetupError",
          "RestoreError", "CheckpointJoinError"}

_debug = False


def set_debug(on: bool) -> None:
    global _debug
    _debug = bool(on)


def debug_enabled() -> bool:
    """--debug, or LLAMA31_405B_DEBUG set to anything but '', '0', 'false', 'no'."""
    return _debug or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def exit_code(exc: BaseException) -> int:
    for cls in type(exc).__mro__:
        if cls.__name__ in KINDS:
            return KINDS[cls.__name__]
    return EXIT_FAILED


def describe(exc: BaseException) -> str:
    """The exception as words: its message, with the class name in front unless the message is
    one of the project's own (which name file, key, rank or tensor)."""
    msg = str(exc).strip()
    if any(c.__name__ in _PLAIN for c in type(exc).__mro__):
        return msg or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    name = type(exc).__name__
    if name == "CheckpointException":   # torch DCP: {rank: (exception, traceback)} per rank
        failures = getattr(exc, "failures", None) or {}
        parts = [f"rank {r}: {type(e[0] if isinstance(e, tuple) else e).__name__}: "
                 f"{e[0] if isinstance(e, tuple) else e}" for r, e in sorted(failures.items())]
        return "torch.distributed.checkpoint failed: " + ("; ".join(parts) or msg)
    return f"{name}: {msg}" if msg else name


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        return 0


def error(message: str, *, rank: int | None = None, exc: BaseException | None = None) -> None:
    """Print the one error line (and, under --debug, `exc`'s traceback first)."""
    if exc is not None and debug_enabled():
        traceback.print_exception(exc, file=sys.stderr)
    rank = _rank() if rank is None else rank
    lines = str(message).rstrip().splitlines() or ["failed"]
    head = f"error: {'' if rank == 0 else f'rank {rank}: '}{lines[0]}"
    print("\n".join([head, *(f"  {ln}" if not ln.startswith(" ") else ln for ln in lines[1:])]),
          file=sys.stderr, flush=True)


def fail(exc: BaseException, *, prefix: str = "") -> int:
    """Report `exc` the one way (error line; traceback only under --debug); its exit status."""
    error(prefix + describe(exc), exc=exc)
    return exit_code(exc)


def run_command(func, args) -> int:
    """Run a command handler: its return value, or the failure convention for what it raised
    (SystemExit passes: argparse and sys.exit say what they mean)."""
    try:
        return int(func(args) or 0)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        if debug_enabled():
            traceback.print_exc()
        return EXIT_INTERRUPTED
    except BaseException as e:  # noqa: BLE001 - the convention covers every failure
        return fail(e)
