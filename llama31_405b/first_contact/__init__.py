"""First contact with a GPU: the smallest slice of the real training path, each check reported
as passed, failed or not run (with the reason), written to a JSON report as it goes.

    python -m llama31_405b first-contact [--config CONFIG] [--json] [--phases slice,dp2,layer]
        [--report FILE] [--budget-s S] [--layers 1] [--seq-length N] [--steps 3] [--cpu]

The slice ("slice" phase) is the configured model at 405B width (hidden 16384, FFN 53248, 128
query / 8 KV heads, from the config) with 1 transformer layer, TP = PP = CP = 1, MiniBS 2 of
MBS 1, a 32,768-row vocabulary (the 128,256-row embedding and output layer would need ~76 GB of
training state on their own), a constant learning rate (slice.SLICE_LR), built by the project's
builder and run by the project's training loop (`train.loop.Run`): full-iteration CUDA graphs;
a checkpoint saved, then loaded as the initial checkpoint; the warm-up (optimizer steps and
evaluation passes on synthetic tokens, graphs captured) and its in-place restore; a training
step and an evaluation pass each replayed and run eagerly on the same batch and weights;
training steps with optimizer updates; an evaluation. Data: synthetic tokens; nothing is read
from disk but the checkpoint.

With Transformer Engine: TE layers, the configured recipe where the GPU has it (NVFP4 needs
compute capability >= 10.0), otherwise FP8 (>= 8.9), sequence length the config's. Without TE
(a bare GPU image): Megatron's local layers in BF16 through every check that does not need TE;
`recipe` says "not run: needs Transformer Engine", and the sequence length defaults to 2048
(slice.LOCAL_SEQ_LENGTH: the local attention materialises the scores). Memory: 4.3 B parameters
x 16 bytes (BF16 weight and gradient, FP32 master, two Adam moments) = 64 GiB plus activations
for one layer; a second layer adds 50 GiB, too tight for one H200's 139 GiB.

"dp2" phase: with two or more GPUs, the slice at DP 2 with the distributed optimizer, the
overlapped parameter gather and full-iteration graphs: a replayed training step and the
evaluation after training steps must use synchronised weights (module dp2); with one GPU "not run: needs 2 GPUs". "layer" phase
(P4): the BF16 matrix-product ceiling of the GPU and one 405B-width layer's forward and
backward time, MFU and the planner's prediction (module layer). `--cpu` runs the slice and the
DP 2 phase on the CPU (gloo, no CUDA graphs) with the config's own width: tiny configs only.
Before anything is built, the slice and the DP 2 phase's ranks are estimated against the memory
they would run in (module fit: the host's with --cpu, else the GPU's and the host's); one that
cannot fit is refused, its first check (`build`, `dp2_eval_sync`) failed naming the estimate,
the memory available and the configs that fit, instead of the out-of-memory killer ending the
process with no message.

Checks (report.CHECKS; a check whose prerequisite did not pass is not run, naming it). Exit
status 1 when any check failed, 0 otherwise (also when checks were not run: on a machine
without a GPU every check is "not run").
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Protocol

from .checks import run_checks
from .report import CHECKS, PHASES, Check, Report
from .slice import (_SYSTEM_OF_GPU, DEFAULT_CONFIG, LOCAL_SEQ_LENGTH, SLICE_LR, TE_SERIES,
                    VOCAB, SyntheticTokens, choose_recipe, slice_config, system_of_gpu)

__all__ = ["CHECKS", "PHASES", "Check", "Report", "run_checks", "choose_recipe", "slice_config",
           "SyntheticTokens", "DEFAULT_CONFIG", "LOCAL_SEQ_LENGTH", "SLICE_LR", "TE_SERIES",
           "VOCAB", "system_of_gpu", "_SYSTEM_OF_GPU", "add_arguments", "run", "main"]


class Args(Protocol):
    """The command line of add_arguments (an argparse.Namespace of its parser)."""
    config: str
    phases: str
    layers: int
    seq_length: int | None
    steps: int
    workdir: str | None
    report: str | None
    budget_s: float | None
    cpu: bool
    json: bool
    traceback: bool


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=str(DEFAULT_CONFIG),
                   help="the config whose model, recipe and performance settings are sliced")
    p.add_argument("--phases", default="slice,dp2",
                   help="comma-separated, run as layer, slice, dp2: layer (P4: matrix ceiling and one "
                        "405B-width layer), slice (one GPU), dp2 (two GPUs); default slice,dp2")
    p.add_argument("--layers", type=int, default=1,
                   help="transformer layers (1: ~64 GiB of weights and optimizer state; each "
                        "more adds 50 GiB)")
    p.add_argument("--seq-length", type=int, default=None,
                   help=f"sequence length (default: the config's with Transformer Engine, "
                        f"{LOCAL_SEQ_LENGTH} without)")
    p.add_argument("--steps", type=int, default=3, help="timed training steps")
    p.add_argument("--workdir", default=None, help="where the checkpoint goes (default: a "
                   "temporary directory, removed afterwards)")
    p.add_argument("--report", default=None,
                   help="JSON report file, rewritten after every check (a killed run keeps it)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="seconds this run may take: a phase that cannot fit is reported not run")
    p.add_argument("--cpu", action="store_true",
                   help="run on the CPU (gloo, no CUDA graphs) at the config's width: tiny "
                        "configs, to rehearse the path without a GPU")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument("--traceback", action="store_true",
                   help="add the Python traceback to a failed check's detail")


def run(args: Args) -> int:
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        print(f"error: --phases: unknown phase(s) {', '.join(unknown)}; known: "
              f"{', '.join(PHASES)}", file=sys.stderr)
        return 2
    rep = run_checks(args.config, layers=args.layers, seq_length=args.seq_length,
                     steps=args.steps, workdir=args.workdir, tracebacks=args.traceback,
                     phases=phases, report_path=args.report, budget_s=args.budget_s,
                     cpu=args.cpu)
    print(rep.as_json() if args.json else rep.text(), flush=True)
    if not args.json:
        print(f"\n{rep.failures} failed, "
              f"{sum(c.status == 'passed' for c in rep.checks.values())} passed, "
              f"{sum(c.status == 'not run' for c in rep.checks.values())} not run",
              file=sys.stderr)
    return 1 if rep.failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llama31_405b first-contact",
                                description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))
