"""`python -m llama31_405b <command>`: each command group lives in its own module.

A module in COMMANDS exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int` as the handler. Modules are imported only when listed, and heavy imports
(torch, megatron) stay inside the handlers so `config check` answers in well under a second.
Every command ends a failure the same way (one error line, an exit status per kind, no traceback
unless --debug or LLAMA31_405B_DEBUG=1): `llama31_405b.failures`.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "checkpoint": "llama31_405b.cli.checkpoint_cmd",
    "config": "llama31_405b.cli.config_cmd",
    "data": "llama31_405b.cli.data_cmd",
    "demo": "llama31_405b.cli.demo_cmd",
    "compliance": "llama31_405b.cli.compliance_cmd",
    "submission": "llama31_405b.cli.submission_cmd",
    "report": "llama31_405b.cli.report_cmd",
    "plan": "llama31_405b.cli.plan_cmd",
    "profile": "llama31_405b.cli.profile_cmd",
    "launch": "llama31_405b.cli.launch_cmd",
    "train": "llama31_405b.cli.train_cmd",
    "rehearse": "llama31_405b.cli.rehearse_cmd",
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its usage errors ending like every other failure (llama31_405b.failures):
    the usage, then one `error: <command>: <what>` line, status 2. Subcommands' parsers are of
    this class too (argparse makes them with the parent's class)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f"error: {self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m llama31_405b",
        description="Llama 3.1 405B MLPerf Training reference (NVFP4, GB200 NVL72)")
    parser.add_argument("--debug", action="store_true",
                        help="on a failure, print the traceback before the error line (also: "
                             "LLAMA31_405B_DEBUG=1 in the environment)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..known_warnings import quiet_known_warnings
    quiet_known_warnings()
    from ..failures import run_command, set_debug
    args = build_parser().parse_args(argv)
    set_debug(args.debug)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
