"""MLPerf compliance and submission: the checks before a launch, the submission package, the report.
The log format itself (reading, writing, the compliance checker, the ruleset) is `llama31_405b.mlperf`.

One module per concern:
- `tiny_rules`: the tiny benchmark's rules file for the checker's `--config`, generated from
  `config.rules.TINY_LLAMA31` and the checker's own common rules.
- `rcp`: reference convergence points (the package's for llama31_405b, the project's for tiny).
- `precheck`: what the checker says about a config before any cluster time is spent.
- `package`: `<org>/{results,systems,benchmarks}` and the package checker, RCP checker, summarizer.
- `report`: the PNG and text summary of a set of runs.
"""
