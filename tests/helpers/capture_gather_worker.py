"""One short multi-rank run (under torchrun, gloo) at VP 1 with the full-iteration training
graph stood in for by the replay double (tests/helpers/graph_double.py) and captured right after
a forced synchronous parameter gather: `run.warmup_iters = 1` puts the capture on the first timed
step, which follows the restore's forced gather (train.warmup) with no training step between.
The validator refuses that setting with full-iteration graphs (its reason: the capture would come
after run_start), so the config is changed after validation, as the double is installed directly.

After every replayed training step, before the optimizer step that follows it, each rank copies
its parameter buffers, forces a synchronous gather and records how many elements the gather
changed: none if the replay gathered the weights of the last optimizer step.

usage: torchrun ... tests/helpers/capture_gather_worker.py CONFIG OVERRIDES_JSON OUT_JSON [no-reset]
`no-reset` disables train.graphs' dispatch-state reset before the capture (the check that the
test fails without it). tests/test_train_graph_gather.py starts the ranks through tests/helpers/zygote.py.
"""
from __future__ import annotations

import dataclasses
import json
import sys


def _stale_elements(model) -> int:
    """Elements of this rank's parameter buffers that a forced gather changes."""
    import torch
    model = model if isinstance(model, list) else [model]
    before = [b.param_data.clone() for m in model for b in m.buffers]
    with torch.no_grad():
        for m in model:
            m.start_param_sync(force_sync=True)
    after = [b.param_data for m in model for b in m.buffers]
    return int(sum((a != b).sum() for a, b in zip(before, after)))


def main() -> int:
    cfg_path, overrides, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    no_reset = sys.argv[4:] == ["no-reset"]
    import torch.distributed as dist

    import graph_double
    import megatron.core.full_cuda_graph as fcg
    from llama31_405b.config import load_config
    from llama31_405b.train import graphs
    from llama31_405b.train.loop import Run

    cfg = load_config(cfg_path, overrides=overrides)
    cfg = dataclasses.replace(
        cfg, performance=dataclasses.replace(cfg.performance, cuda_graphs="full_iteration"),
        run=dataclasses.replace(cfg.run, warmup_iters=1))
    before_reset: list[list[bool]] = []     # the gather flags the reset found (capture time)
    capture_call = graphs._GatheringCapture.__call__

    def recording_call(self, **kwargs):
        w = self.wrapper
        if type(w).cuda_graph["training"] is None and \
                type(w).curr_iteration["training"] == w.cuda_graph_warmup_steps:
            before_reset.append(graph_double._flags(kwargs["model"]))
            if no_reset:
                return w(**kwargs)          # the capture without the reset
        return capture_call(self, **kwargs)

    graphs._GatheringCapture.__call__ = recording_call
    double = graph_double.install()
    checks: list[list[int]] = []

    class Checked(double):
        def __call__(self, **kwargs):
            replays = graph_double.REPLAYS["training"]
            out = super().__call__(**kwargs)
            if graph_double.REPLAYS["training"] > replays:
                checks.append([graph_double.REPLAYS["training"], _stale_elements(kwargs["model"])])
            return out

    fcg.FullCudaGraphWrapper = Checked
    run = Run(cfg, seed=cfg.run.seed_base, hooks=[], timeout_s=120, init_checkpoint="")
    status = run.execute()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, {"checks": checks, "vp": run.model[0].config
                                   .virtual_pipeline_model_parallel_size,
                                   "chained_gathers": sum(g.next_param_gather_bucket_group is not None
                                                          for m in run.model for g in m.bucket_groups),
                                   "capture_flags": graph_double.CAPTURES.get("training"),
                                   "before_reset": before_reset})
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"status": status, "reason": run.state.reason, "ranks": every,
                       "replays": graph_double.REPLAYS}, f)
    from llama31_405b.parallel.setup import teardown_parallel
    teardown_parallel()
    return 0 if status == "aborted" and run.state.reason.startswith("target") else 1


if __name__ == "__main__":
    sys.exit(main())
