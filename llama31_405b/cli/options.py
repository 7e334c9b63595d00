"""Command-line options shared by commands that load a config (`train`, `launch ...`)."""
from __future__ import annotations

from ..config.overrides import load_with_sets  # noqa: F401  (the commands' loader)


def add_set_option(p) -> None:
    """`--set SECTION.KEY=VALUE` (repeatable): config overrides, checked like a file's keys.
    run_and_time.sh passes the data, checkpoint and rack-override paths this way."""
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (TOML value; repeatable), e.g. "
                        "--set data.data_dir=/data --set run.seed_base=7")


def load_or_report(path: str, sets: list[str] | None):
    """load_with_sets, or None after printing the ConfigError as the one error line (callers exit
    with EXIT_INPUT, 2: llama31_405b.failures). A command with nothing to do after a bad config
    can instead let the ConfigError end it (cli.main reports it the same way)."""
    from ..config import ConfigError
    from ..failures import error
    try:
        return load_with_sets(path, sets)
    except ConfigError as e:
        error(str(e))
        return None


def run_count(text: str) -> int:
    """argparse type of a number of runs: a whole number >= 1 (argparse names the option in its
    message: "argument --runs: 0: the number of runs must be >= 1")."""
    import argparse
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a whole number of runs") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: the number of runs must be >= 1")
    return n
