#!/usr/bin/env python3
"""`make typecheck`: mypy over llama31_405b/ against the pinned Transformer Engine and
megatron-core sources (configuration: mypy.ini; docs/typecheck.md), then the proof that the
check can fail.

1. The sources: scripts/fetch_te_sources.py (cached in .cache/te-2.20.2/ after the first run).
2. The check: `mypy` with mypy.ini. Any error fails.
3. The seeded check: SEEDS below put three faults into copies of three of the package's files
   (a misspelled keyword to a Transformer Engine module constructor, an attribute TE 2.20.2
   does not have, a wrong keyword to a megatron-core function only the GPU path calls); mypy
   runs again with each copy standing in for its file (`--shadow-file`: the copies are read,
   the errors name the real path) and must report every seed at its file and line, with its
   message and error code. A seed is reported even in a module that mypy.ini excludes: the copy
   ends with an inline `# mypy: ignore-errors=False, enable-error-code="CODE"`, which takes
   precedence over the configuration file, appended so that no line moves. Errors of the seeded
   run other than the seeds are the first run's business, not this one's.

Exit 0 when both hold; 1 when the package has errors or a seed went unreported; 2 when a seed
no longer applies (its text is gone from its file: update SEEDS) or the sources cannot be had.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Seed:
    what: str
    file: str        # relative to the repository
    old: str         # text in `file`, replaced once by `new`
    new: str
    at: str          # the error is due on the line where the last `at` up to the end of
                     # `new` begins (mypy reports a call's errors on the line of the call)
    message: str     # regex the error's message must match
    code: str        # mypy's error code for it

    def unexclude(self) -> str:
        """The inline configuration appended to the copy: the seed is reported even where
        mypy.ini excludes its module (inline comments take precedence)."""
        return f'\n# mypy: ignore-errors=False, enable-error-code="{self.code}"\n'

    def apply(self, text: str) -> tuple[str, int]:
        """The seeded text and the 1-based line the error must be reported on."""
        n = text.count(self.old)
        if n != 1:
            raise SeedError(f"{self.file}: the seed for {self.what} expects its text once, found "
                            f"it {n} times: {self.old.strip()!r}; the code moved, so pick a "
                            "new place for the seed in scripts/typecheck.py SEEDS")
        start = text.index(self.old)
        seeded = text.replace(self.old, self.new)
        at = seeded.rfind(self.at, 0, start + len(self.new))
        if at < 0:
            raise SeedError(f"{self.file}: the seed for {self.what}: {self.at!r} not found up to "
                            "the seeded text; fix its `at` in scripts/typecheck.py SEEDS")
        return seeded, seeded.count("\n", 0, at) + 1


class SeedError(Exception):
    pass


SEEDS = (
    Seed("a misspelled keyword to a Transformer Engine module constructor",
         "llama31_405b/train/loop.py",
         "        from transformer_engine.pytorch import module as te_module\n",
         "        from transformer_engine.pytorch import module as te_module\n"
         "        te_module.LayerNormLinear(8, 8, normalisation='RMSNorm')\n",
         "te_module.LayerNormLinear(",
         r'Unexpected keyword argument "normalisation" for "LayerNormLinear"', "call-arg"),
    Seed("an attribute Transformer Engine 2.20.2 does not have",
         "llama31_405b/precision/te_recipe.py",
         "recipe.disable_stochastic_rounding",
         "recipe.stochastic_rounding",
         "recipe.stochastic_rounding",
         r'"NVFP4BlockScaling" has no attribute "stochastic_rounding"', "attr-defined"),
    Seed("a wrong keyword to a megatron-core function only the GPU path calls",
         "llama31_405b/train/graphs.py",
         "cuda_graph_warmup_steps=EVAL_CAPTURE_PASS",
         "cuda_graph_warmup_iters=EVAL_CAPTURE_PASS",
         "FullCudaGraphWrapper(",
         r'Unexpected keyword argument "cuda_graph_warmup_iters" for "FullCudaGraphWrapper"',
         "call-arg"),
)

ERROR = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+): error: (?P<msg>.*)$")


def mypy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=REPO,
                          capture_output=True, text=True)


def errors(output: str) -> list[tuple[str, int, str]]:
    """(file, line, message) of each error line of mypy's output."""
    return [(m["file"], int(m["line"]), m["msg"])
            for m in map(ERROR.match, output.splitlines()) if m]


def unreported(seeds, expected: dict[Seed, int], found: list[tuple[str, int, str]]) -> list[str]:
    """One line per seed that no error of `found` reports at its file and line."""
    missing = []
    for s in seeds:
        line = expected[s]
        if not any(f == s.file and ln == line and re.search(s.message, msg)
                   and msg.endswith(f"[{s.code}]") for f, ln, msg in found):
            near = [f"{ln}: {msg}" for f, ln, msg in found if f == s.file]
            missing.append(f"{s.file}:{line}: {s.what} was not reported (expected "
                           f"/{s.message}/ [{s.code}]); the seeded run's errors in that file: "
                           f"{near or 'none'}")
    return missing


def seeded_check(seeds=SEEDS) -> tuple[int, str]:
    """Run mypy with the seeded copies shadowing their files; (exit status, report)."""
    with tempfile.TemporaryDirectory(prefix="typecheck-seeds-") as d:
        args, expected = [], {}
        for i, s in enumerate(seeds):
            text, expected[s] = s.apply((REPO / s.file).read_text())
            copy = Path(d) / f"{i}_{Path(s.file).name}"
            copy.write_text(text + s.unexclude())
            args += ["--shadow-file", s.file, str(copy)]
        r = mypy(*args)
    missing = unreported(seeds, expected, errors(r.stdout))
    if r.returncode not in (0, 1) or missing:
        return 1, "\n".join(missing + ([r.stderr.strip()] if r.stderr.strip() else []))
    return 0, "\n".join(f"  {s.file}:{expected[s]}: {s.what}: reported" for s in seeds)


def main() -> int:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_te_sources.py")])
    if r.returncode:
        return 2
    r = mypy()
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.returncode:
        print("typecheck: the package has type errors (above)", file=sys.stderr)
        return 1
    try:
        rc, report = seeded_check()
    except SeedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if rc:
        print(f"typecheck: the seeded faults were not all reported; the check cannot be "
              f"trusted:\n{report}", file=sys.stderr)
        return 1
    print(f"typecheck: the seeded faults, each reported at its file and line:\n{report}")
    print(f"typecheck: passed in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
