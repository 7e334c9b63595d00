"""The MLPerf log format, owned here; everything else (training, `launch check-log`, `demo`,
`report`, `submission package`, the tests) calls these modules in-process.

- `header`: config -> the header events (shared by the training hook and the precheck).
- `log`: the line format and the reader (file and line of every malformed line; `RunLog`: status,
  time to train, evaluations, step times).
- `writer`: the writer the training run logs through (unbuffered, one error on a failed write,
  run_stop exactly once from any thread).
- `checker`: the real mlperf-logging compliance checker in-process, and `RULESET`, the ruleset
  this project submits under (defined there, once).
"""
from .header import Event, header_events

__all__ = ["Event", "header_events"]
