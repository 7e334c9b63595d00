"""A tiny CPU run with full-iteration CUDA graphs, the graph capture replaced by a recorder.

usage: python tests/helpers/graph_probe.py CONFIG OVERRIDES_JSON OUT_JSON

Only torch's capture API is replaced (torch.cuda.CUDAGraph, torch.cuda.graph,
torch.cuda.graph_pool_handle), not megatron's FullCudaGraphWrapper: the wrapper copies the
microbatches into its static buffers, runs eagerly, "captures" (the recorder runs the body
eagerly and notes it) and "replays" (the recorder notes which static inputs the graph would
read). Written: every capture and replay with the stage, the phase (init = before run_start)
and digests of the static token buffers; every Python forward of the model with its input's
digest and whether it was a static buffer; and the digests of the microbatches the run should
have fed (training steps and evaluations, read from the datasets after the run).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import sys

PHASE = {"now": "init"}
REC = {"captures": [], "replays": [], "forwards": [], "registered": 0}


def digest(t) -> str:
    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()[:16]


def _stage_of(graph) -> str:
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper
    return next(k for k, g in FullCudaGraphWrapper.cuda_graph.items() if g is graph)


def _static_tokens(stage: str) -> list:
    from megatron.core.full_cuda_graph import StaticBufferLoader
    return [b["tokens"] for b in StaticBufferLoader.static_buffers[stage]]


class RecorderGraph:
    def register_generator_state(self, state):
        REC["registered"] += 1

    def replay(self):
        stage = _stage_of(self)
        REC["replays"].append({"stage": stage, "phase": PHASE["now"],
                               "tokens": [digest(t) for t in _static_tokens(stage)]})


@contextlib.contextmanager
def recorder_capture(graph, stream=None, pool=None, capture_error_mode="global"):
    REC["captures"].append({"stage": _stage_of(graph), "phase": PHASE["now"]})
    yield


def main() -> int:
    cfg_path, overrides, out_path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    import torch
    torch.cuda.CUDAGraph = RecorderGraph
    torch.cuda.graph = recorder_capture
    torch.cuda.graph_pool_handle = lambda: ("recorder-pool",)

    from llama31_405b.config import load_config
    from llama31_405b.train.batches import train_microbatches
    from llama31_405b.train.evaluation import eval_batches
    from llama31_405b.train.hooks import Hook
    from llama31_405b.train.loop import Run

    # CPU system + CUDA graphs is refused by validation; the recorder needs exactly that
    cfg = load_config(cfg_path, overrides=overrides, validate=False)

    from llama31_405b.model import builder
    build_model = builder.build_model

    def build_and_watch(*a, **k):
        chunks = build_model(*a, **k)
        for chunk in chunks:
            chunk.register_forward_pre_hook(forward_seen)
        return chunks
    builder.build_model = build_and_watch

    class Phase(Hook):
        def on_run_start(self, run):
            PHASE["now"] = "run"

    def forward_seen(module, args):
        tokens = args[0]
        stage = "training" if module.training else "validation"
        REC["forwards"].append({"stage": stage, "phase": PHASE["now"], "tokens": digest(tokens),
                                "static": any(tokens.data_ptr() == t.data_ptr()
                                              for t in _static_tokens(stage))})

    run = Run(cfg, seed=cfg.run.seed_base, hooks=[Phase()], timeout_s=120)
    REC["status"], REC["reason"] = run.execute(), None
    REC["reason"] = run.state.reason
    d, b = cfg.derived, cfg.batch
    REC["expected_train"] = [
        [digest(mb["tokens"]) for mb in train_microbatches(
            run.train_ds, step=k, gbs=d.gbs, minibs=b.minibs, mbs=b.micro_batch_size,
            dp_rank=run.info.dp_rank)] for k in range(run.state.step)]
    REC["expected_eval"] = [digest(mb["tokens"]) for mb in eval_batches(
        run.valid_ds, cfg, dp_rank=run.info.dp_rank, dp=run.info.dp_size)]
    REC["evals"] = [e[0] for e in run.state.evals]
    with open(out_path, "w") as f:
        json.dump(REC, f)
    from llama31_405b.parallel.setup import teardown_parallel
    teardown_parallel()  # as `train` does, before interpreter exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
