"""`checkpoint convert --hf DIR --config CONFIG [--chunks-tp N] --out DIR` and
`checkpoint verify --hf DIR --megatron DIR --config CONFIG`."""
from __future__ import annotations

import sys


def register(sub) -> None:
    p = sub.add_parser("checkpoint", help="convert and verify the initial checkpoint")
    s = p.add_subparsers(dest="checkpoint_command", required=True, metavar="ACTION")
    c = s.add_parser("convert", help="Hugging Face Llama 3.1 safetensors -> Megatron distributed "
                     "checkpoint (streamed tensor by tensor; resumable)")
    c.add_argument("--hf", required=True, metavar="DIR", help="Hugging Face model directory")
    c.add_argument("--config", required=True, metavar="CONFIG",
                   help="run config: model shape, parameter dtype (precision.params) and the "
                   "chunking: every tensor is stored split as megatron-core splits it at the "
                   "config's parallel.tp, so a run at that TP reads the checkpoint once per job "
                   "(docs/checkpoint.md); it loads at any other TP too")
    c.add_argument("--chunks-tp", type=int, default=None, metavar="N",
                   help="store the chunks of TP N instead of the config's parallel.tp; 1 writes "
                   "whole layers (each of a run's TP ranks then reads every layer whole)")
    c.add_argument("--out", required=True, metavar="DIR",
                   help="output directory (new or empty; a rerun resumes an interrupted one)")
    c.set_defaults(func=convert_cmd)
    v = s.add_parser("verify", help="load both checkpoints, run a few sequences, report the "
                     "largest logit difference (run with the config's world size)")
    v.add_argument("--hf", required=True, metavar="DIR")
    v.add_argument("--megatron", required=True, metavar="DIR")
    v.add_argument("--config", required=True, metavar="CONFIG",
                   help="layout (TP/PP/VP) and dtype to load the Megatron checkpoint at")
    v.add_argument("--sequences", type=int, default=4, help="random token sequences (default 4)")
    v.add_argument("--seq-len", type=int, default=32, help="tokens per sequence (default 32)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--tolerance", type=float, default=None,
                   help="largest allowed logit difference (default 1e-4 for fp32 params, "
                   "0.25 for bf16)")
    v.set_defaults(func=verify_cmd)


def _error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def convert_cmd(args) -> int:
    import os
    # Conversion is host-memory and disk work. Hiding GPUs (before CUDA initialises) keeps it off
    # them and makes the builder use Megatron's local layer spec, whose checkpoint keys are the
    # Transformer Engine spec's (see checkpoint.mapping).
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from ..checkpoint.convert import convert
    from ..checkpoint.hf_reader import HFCheckpointError
    from ..checkpoint.mapping import ConversionError
    from ..config import ConfigError, load_config
    try:
        cfg = load_config(args.config)
        convert(args.hf, cfg, args.out, chunk_tp=args.chunks_tp,
                log=lambda s: print(s, file=sys.stderr, flush=True))
    except (ConfigError, HFCheckpointError, ConversionError, FileExistsError) as e:
        return _error(str(e))
    return 0


def verify_cmd(args) -> int:
    from ..checkpoint.verify import verify
    from ..config import ConfigError, load_config
    from ..parallel.setup import ParallelSetupError, setup_parallel, teardown_parallel
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        return _error(str(e))
    if cfg.parallel.cp > 1:
        return _error(f"{args.config}: verify runs without context parallelism (parallel.cp = "
                      f"{cfg.parallel.cp}); use a copy of the config with cp = 1: the checkpoint "
                      "does not depend on CP")
    if args.seq_len > cfg.model.seq_length:
        return _error(f"--seq-len {args.seq_len} exceeds model.seq_length "
                      f"{cfg.model.seq_length} of {args.config}")
    tol = args.tolerance if args.tolerance is not None else (
        1e-4 if cfg.precision.params == "fp32" else 0.25)
    try:
        info = setup_parallel(cfg)
    except ParallelSetupError as e:
        return _error(str(e))
    try:
        r = verify(cfg, args.hf, args.megatron, sequences=args.sequences, seq_len=args.seq_len,
                   seed=args.seed)
    except FileNotFoundError as e:
        return _error(str(e))
    finally:
        teardown_parallel()
    ok = r.max_abs_diff <= tol
    if info.is_rank0:
        print(f"verify: {r.sequences} sequences x {r.seq_len} tokens at TP{cfg.parallel.tp} "
              f"PP{cfg.parallel.pp} VP{cfg.parallel.vp}: max |logit diff| = "
              f"{r.max_abs_diff:.3e} (largest |logit| {r.max_abs_logit:.3g}, next-token argmax "
              f"agreement {100 * r.argmax_agreement:.1f}%; checkpoint in the chunks of "
              f"TP{r.chunk_tp}), tolerance {tol:g}: "
              f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1
