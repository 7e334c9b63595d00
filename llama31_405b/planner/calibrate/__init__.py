"""Calibration: the planner's constants fitted to a measured step, in one line of stages.

    summary = from_profile(folder, cfg)      # read_profile.py: a `profile` folder -> Summary
    fit = solve(summary, cfg)                # solver.py: the constants that reproduce it
    checked = check(summary, fit, cfg)       # solver.py: simulated next to measured
    write(path, summary, fit, precision, checked)   # file.py: the calibration file (TOML)
    cal = read(path)                         # file.py: ... and back, for --calibration FILE

`plan --calibrate` (cli/calibrate.py) runs exactly that (several folders of one layout:
`median_summary` of their summaries first; folders of several layouts, one `--config` each:
the median per layout, then `solve_joint` of them all). The modules, one per stage:

* constants.py: the model's constants as data, the assumed priors (`ASSUMED`) and the fitted
  ones (`Fitted`); the model modules import only this;
* summary.py: what a fit is fitted to (`Summary`), the published 128-rack step as one
  (`CALIBRATION`), and the median of several;
* read_profile.py: a profile folder -> a Summary (graphed.py: a run with full-iteration CUDA
  graphs calibrates as its replayed step, not the eager steps its trace holds);
  first_contact.py: first contact's report -> a partial fit (one GEMM rate);
* solver.py: the solve (`solve`; `fitted()`: the published fit, solved once per process);
  joint.py: one fit of several layouts (`solve_joint`: folders of two or more layouts);
* file.py: the calibration file, written and read, and which configs it may serve;
* synthetic.py: a profile folder of the planner's own prediction (the round trip's tests).

The solver imports the model, which imports constants.py: `solve`, `check` and `fitted` import
it when called, so that the model's import of the constants does not pull the solver in.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .constants import ASSUMED, INITIAL, MODEL_REVISION, Assumed, Fitted
from .file import Calibration, mismatches, read, write
from .read_profile import ProfileSummaryError, from_profile, layout_mismatches, manifest
from .summary import CALIBRATION, KINDS, PUBLISHED, Summary, load_summary, median_summary

if TYPE_CHECKING:
    from ...config.schema import Config


def solve(summary: Summary = CALIBRATION, cfg: Config | None = None) -> Fitted:
    """The constants for which the simulated step of the summary's layout (`cfg`, else the
    config it names) reproduces it (solver.solve)."""
    from .solver import solve as _solve
    return _solve(summary, cfg)


def solve_joint(items: Sequence[tuple[Summary, Config | None]]) -> Fitted:
    """One set of constants fitted to several measured layouts ((summary, config) each;
    joint.solve_joint: the transport's latency from one layout's TP, its bandwidth from
    another's DP, the other constants averaged over the layouts)."""
    from .joint import solve_joint as _joint
    return _joint(items)


def check(summary: Summary, fit: Fitted, cfg: Config | None = None) -> dict:
    """The file's [check]: the simulated step and compute next to the measured (solver.check)."""
    from .solver import check as _check
    return _check(summary, fit, cfg)


def fitted() -> Fitted:
    """The constants of the published calibration point (solved once per process)."""
    from .solver import fitted as _fitted
    return _fitted()


__all__ = ["ASSUMED", "CALIBRATION", "INITIAL", "KINDS", "MODEL_REVISION", "PUBLISHED", "Assumed", "Calibration",
           "Fitted", "ProfileSummaryError", "Summary", "check", "fitted", "from_profile",
           "layout_mismatches", "load_summary", "manifest", "median_summary", "mismatches",
           "read", "solve", "solve_joint", "write"]
