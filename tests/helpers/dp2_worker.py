"""One rank of first-contact's DP 2 phase (llama31_405b.first_contact.dp2.worker) on the CPU
with full-iteration CUDA graphs stood in for by the replay double (tests/helpers/graph_double.py),
so that the phase's training-graph check meets replay semantics: a replay runs no Python, and
gathers only what its capture recorded.

Before the worker runs, this script
- installs the double and turns the slice's graphs on (the phase's `--cpu` slice has none);
- with DP2_NO_RESET=1, replaces `train.gather_dispatch.reset` by a no-op, under every name it is
  bound to in the package (train.graphs' capture reset, train.evaluation's): the check that the
  phase can fail without it;
- watches every evaluation pass: a forward that reads a parameter whose bucket group's all-gather
  is still in flight (dispatched, not waited for) is counted as a read racing the gather.
Each rank writes what it saw to $DP2_PROBE_DIR/rank<RANK>.json.

usage: tests/test_first_contact_dp2_reset.py sets dp2.WORKER = (this script,), so each rank runs
`python tests/helpers/dp2_worker.py <the worker's arguments>` with dp2's environment.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def _no_reset() -> int:
    """Bind a no-op in place of gather_dispatch.reset wherever the package imported it."""
    import llama31_405b.train.evaluation  # noqa: F401  (bind the names before replacing them)
    import llama31_405b.train.graphs  # noqa: F401
    from llama31_405b.train import gather_dispatch
    real = gather_dispatch.reset

    def no_reset(model) -> int:
        return 0

    replaced = 0
    for name, mod in list(sys.modules.items()):
        if name.startswith("llama31_405b") and mod is not None:
            for attr, value in list(vars(mod).items()):
                if value is real:
                    setattr(mod, attr, no_reset)
                    replaced += 1
    return replaced


def _watch_evaluations(records: list[dict]) -> None:
    """Wrap train.evaluation.evaluate (imported by its callers when they run): during each pass,
    a forward pre-hook after DDP's on every module with parameters counts the parameters read
    while their bucket group's gather is in flight."""
    from llama31_405b.train import evaluation
    real = evaluation.evaluate

    def evaluate(model_chunks, *args, **kwargs):
        rec = {"pre_hooks": all(bool(m.remove_forward_pre_hook_handles) for m in model_chunks),
               "in_flight_reads": 0}
        handles = []
        for ddp in model_chunks:
            def check(module, *_, ddp=ddp):
                for p in module.parameters(recurse=False):
                    g = ddp.param_to_bucket_group.get(p)
                    if g is not None and g.param_gather_handle is not None:
                        rec["in_flight_reads"] += 1
            handles += [m.register_forward_pre_hook(check) for m in ddp.module.modules()
                        if any(True for _ in m.parameters(recurse=False))]
        try:
            return real(model_chunks, *args, **kwargs)
        finally:
            for h in handles:
                h.remove()
            records.append(rec)

    evaluation.evaluate = evaluate


def main() -> int:
    import graph_double
    graph_double.install()
    from llama31_405b.first_contact import dp2, slice as slice_mod
    config = slice_mod.slice_config

    def with_graphs(*args, **kwargs):
        return config(*args, **{**kwargs, "graphs": True})

    slice_mod.slice_config = with_graphs
    replaced = _no_reset() if os.environ.get("DP2_NO_RESET") == "1" else 0
    evaluations: list[dict] = []
    _watch_evaluations(evaluations)
    try:
        return dp2.worker(sys.argv[1:])
    finally:
        out = Path(os.environ["DP2_PROBE_DIR"]) / f"rank{os.environ['RANK']}.json"
        out.write_text(json.dumps({"resets_replaced": replaced,
                                   "captures": graph_double.CAPTURES,
                                   "replays": graph_double.REPLAYS,
                                   "evaluations": evaluations}))


if __name__ == "__main__":
    sys.exit(main())
