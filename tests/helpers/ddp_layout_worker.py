"""The DDP wrap of model.builder.wrap_for_training on every rank (tests/test_ddp_layout.py):
megatron-core 0.19.2 gets the distributed optimizer's parameter layout from the builder, logs
no "full_param_layout not provided" warning, and builds the same buffers, buckets and shards as
when it computes the layout itself (a second DDP around the same chunks, without a layout).

usage: torchrun ... tests/helpers/ddp_layout_worker.py CONFIG OVERRIDES_JSON OUT_JSON
"""
from __future__ import annotations

import json
import logging
import sys


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _buffers(ddp) -> list[dict]:
    """Each gradient buffer's layout: sizes, bucket boundaries, parameter index ranges."""
    out = []
    for b in ddp.buffers:
        names = {p: n for n, p in ddp.module.named_parameters()}
        out.append({"numel": b.numel, "unpadded": b.numel_unpadded,
                    "buckets": [[k.offset, k.numel_unpadded, k.grad_data.numel()] for k in b.buckets],
                    "index": sorted([names[p], *v] for p, v in b.param_index_map.items())})
    return out


def main() -> int:
    cfg_path, overrides, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    import torch.distributed as dist

    from llama31_405b import cpu_compat
    from llama31_405b.config import load_config
    from llama31_405b.model.builder import build_model, ddp_config, wrap_for_training
    from llama31_405b.parallel.setup import seed_model_parallel, setup_parallel, teardown_parallel
    from llama31_405b.systems.device import decide
    cfg = load_config(cfg_path, overrides=overrides)
    device = decide(cfg)
    cpu_compat.apply(device)
    setup_parallel(cfg, None, timeout_s=120, device=device)
    seed_model_parallel(1234)
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.distributed import distributed_data_parallel as ddp_module
    records = _Records()
    ddp_module.logger.addHandler(records)
    ddp_module.logger.setLevel(logging.DEBUG)
    chunks = build_model(cfg, device=device)
    wrapped = wrap_for_training(cfg, chunks)
    given = [_buffers(w) for w in wrapped]
    warned = [m for m in records.messages if "full_param_layout not provided" in m]
    # megatron-core's own layout: DDP around the same modules without one
    dcfg = ddp_config(cfg)
    auto = [_buffers(DistributedDataParallel(config=w.config, ddp_config=dcfg, module=w.module,
                                             disable_bucketing=(i > 0)))
            for i, w in enumerate(wrapped)]
    auto_warned = [m for m in records.messages if "full_param_layout not provided" in m]
    mine = {"warned": len(warned), "auto_warned": len(auto_warned),
            "same": given == auto, "buckets": [len(b["buckets"]) for g in given for b in g],
            "first_chunk": [k[1] for k in given[0][0]["buckets"]]}   # unpadded bucket sizes
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(every, f)
    teardown_parallel()
    return 0


if __name__ == "__main__":
    sys.exit(main())
