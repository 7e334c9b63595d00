"""`data prepare | verify | tiny`: build, check and provide the training data (docs/data.md)."""
from __future__ import annotations

import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("data", help="prepare, verify or build the tiny data")
    s = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")

    pr = s.add_parser("prepare", help="tokenize C4 json.gz shards into Megatron indexed datasets",
                      description="Benchmark layout: --config CFG --raw-dir DIR (en_6 = raw "
                      "shards 768-895, en_7 = 896-1023, validation = first 91,205 documents). "
                      "Any shards: --input FILE... --output-prefix PREFIX --tokenizer MODEL.")
    pr.add_argument("--config", help="config naming data_dir, tokenizer and prefixes")
    pr.add_argument("--raw-dir", help="folder with c4-train.NNNNN-of-01024.json.gz and "
                    "c4-validation.NNNNN-of-00008.json.gz (with --config)")
    pr.add_argument("--input", nargs="+", metavar="FILE", help="C4-format shards, in order")
    pr.add_argument("--output-prefix", help="output PREFIX (.bin/.idx), with --input")
    pr.add_argument("--tokenizer", help="sentencepiece model, with --input")
    pr.add_argument("--data-dir", help="folder of the manifest, with --input "
                    "(default: the output's folder)")
    pr.add_argument("--max-docs", type=int, help="keep the first N documents (with --input)")
    pr.add_argument("--min-tokens", type=int, help="fail below N tokens (with --input)")
    pr.add_argument("--workers", type=int, help="worker processes (default: usable cores)")
    pr.add_argument("--skip-bad", action="store_true",
                    help="skip and count malformed lines and lines without text instead of failing")
    pr.add_argument("--force", action="store_true", help="rebuild even if up to date")
    pr.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    pr.set_defaults(func=prepare)

    v = s.add_parser("verify", help="check data against its manifest (training does this too)")
    v.add_argument("config", metavar="CONFIG")
    v.add_argument("--full", action="store_true", help="whole-file sha256 and token-id scan")
    v.add_argument("--write-manifest", action="store_true",
                   help="record files that have no manifest entry yet (e.g. MLCommons' "
                   "ready-made files) after checking their structure")
    v.set_defaults(func=verify)

    t = s.add_parser("tiny", help="build the tiny corpus, tokenizer and datasets if missing")
    t.add_argument("--data-dir", default="work_data/tiny", help="default: work_data/tiny")
    t.add_argument("--workers", type=int)
    t.set_defaults(func=tiny)


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 1


def prepare(args) -> int:
    from ..config import ConfigError, load_config
    from ..data import DataError
    from ..data.prepare import Output, describe
    from ..data.prepare import prepare as run
    try:
        if args.config:
            if args.input or args.output_prefix:
                return _fail("use either --config/--raw-dir or --input/--output-prefix")
            if not args.raw_dir:
                return _fail("--config needs --raw-dir (the folder of the raw C4 json.gz shards)")
            from ..data.layout import benchmark_outputs, data_paths
            cfg = load_config(args.config)
            outputs = benchmark_outputs(cfg, args.raw_dir)
            paths = data_paths(cfg)
            tokenizer, data_dir = paths.tokenizer, paths.data_dir
        else:
            if not (args.input and args.output_prefix and args.tokenizer):
                return _fail("give --config CFG --raw-dir DIR, or --input FILE... "
                             "--output-prefix PREFIX --tokenizer MODEL")
            prefix = Path(args.output_prefix).absolute()
            outputs = [Output(prefix=prefix, inputs=tuple(Path(x) for x in args.input),
                              max_docs=args.max_docs, min_tokens=args.min_tokens)]
            tokenizer = Path(args.tokenizer)
            data_dir = Path(args.data_dir) if args.data_dir else prefix.parent
        results = run(outputs, tokenizer, data_dir=data_dir, workers=args.workers,
                      skip_bad=args.skip_bad, progress=not args.no_progress, force=args.force)
    except (DataError, ConfigError) as e:
        return _fail(str(e))
    describe(results, sys.stdout)
    return 0


def verify(args) -> int:
    from ..config import ConfigError, load_config
    from ..data import DataError
    from ..data.verify import verify_data
    try:
        cfg = load_config(args.config)
        verify_data(cfg, full=args.full, write_manifest=args.write_manifest,
                    log=lambda m: print(m, file=sys.stderr))
    except (DataError, ConfigError) as e:
        return _fail(str(e))
    print(f"data verified for {args.config}")
    return 0


def tiny(args) -> int:
    from ..data import DataError
    from ..data.tiny import ensure_tiny_data
    try:
        path = ensure_tiny_data(args.data_dir, workers=args.workers)
    except DataError as e:
        return _fail(str(e))
    print(f"tiny data ready in {path}")
    return 0
