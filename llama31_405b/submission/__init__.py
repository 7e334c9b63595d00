"""MLPerf compliance and submission: read finished logs, run the real mlperf-logging checkers,
assemble a submission package, draw the report.

One module per concern:
- `mllog`: read MLPerf logs (file and line for every malformed line; `srun -l` prefixes accepted)
  and the numbers a run produced (time to train, evaluations, step times).
- `checker`: the real compliance checker (ruleset 6.0.0 by default, the tiny rules for tiny logs).
- `tiny_rules`: the tiny benchmark's rules file for the checker's `--config`, generated from
  `config.rules.TINY_LLAMA31` and the checker's own common rules.
- `rcp`: reference convergence points (the package's for llama31_405b, the project's for tiny).
- `precheck`: what the checker says about a config before any cluster time is spent.
- `package`: `<org>/{results,systems,benchmarks}` and the package checker, RCP checker, summarizer.
- `report`: the PNG and text summary of a set of runs.
"""
