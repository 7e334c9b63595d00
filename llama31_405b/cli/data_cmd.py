"""`data prepare | verify | tiny`: build, check and provide the training data (docs/data.md).

    python -m llama31_405b data verify CONFIG [--set SECTION.KEY=VALUE ...] [--full]
                                              [--write-manifest]

`data prepare` exits 2 on bad input (arguments, config, a missing or malformed shard or
tokenizer). `data verify` exits 0 when the data passed (a passing verification is then recorded in the manifest,
`data.manifest`, by default DATA_DIR/manifest.json, which `train` requires), 1 when the data failed a check (the message names the file and the
fix), 2 when CONFIG or a --set override is invalid.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .options import add_set_option, load_or_report, load_with_sets


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
    pr.add_argument("--append-eod", action="store_true",
                    help="end every document with the tokenizer's eos id (the MLPerf reference "
                    "does not; recorded in the manifest)")
    pr.add_argument("--force", action="store_true", help="rebuild even if up to date")
    pr.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    add_set_option(pr)
    pr.set_defaults(func=prepare)

    v = s.add_parser("verify", help="check the data's contents and record a passing verification "
                     "in its manifest (train requires one); exit 0 passed, 1 data error, 2 bad "
                     "config")
    v.add_argument("config", metavar="CONFIG")
    v.add_argument("--full", action="store_true", help="whole-file sha256 and token-id scan")
    v.add_argument("--write-manifest", action="store_true",
                   help="record files that have no manifest entry yet (e.g. MLCommons' "
                   "ready-made files), and files that no longer match their entry (a warning "
                   "names each), after checking their structure and contents")
    add_set_option(v)
    v.set_defaults(func=verify)

    t = s.add_parser("tiny", help="build the tiny corpus, tokenizer and datasets if missing")
    t.add_argument("--data-dir", default="work_data/tiny", help="default: work_data/tiny")
    t.add_argument("--workers", type=int)
    t.set_defaults(func=tiny)


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 1


def _bad(msg: str) -> int:
    """`data prepare`'s refusals are about its input (arguments, config, shards, tokenizer): 2."""
    print(f"error: {msg}", file=sys.stderr)
    return 2


def prepare(args) -> int:
    from ..config import ConfigError
    from ..data import DataError
    from ..data.prepare import Output, describe
    from ..data.prepare import prepare as run
    try:
        if args.config:
            if args.input or args.output_prefix:
                return _bad("use either --config/--raw-dir or --input/--output-prefix")
            if not args.raw_dir:
                return _bad("--config needs --raw-dir (the folder of the raw C4 json.gz shards)")
            from ..data.layout import benchmark_outputs, data_paths
            cfg = load_with_sets(args.config, args.set)
            if cfg.run.benchmark != "llama31_405b":
                return _bad(f"{args.config}: the {cfg.run.benchmark} data is built by "
                            "`python -m llama31_405b data tiny`, not from raw C4")
            outputs = benchmark_outputs(cfg, args.raw_dir)
            paths = data_paths(cfg)
            tokenizer, data_dir, manifest = paths.tokenizer, paths.data_dir, paths.manifest
        else:
            if args.set:
                return _bad("--set overrides a config: use it with --config")
            if not (args.input and args.output_prefix and args.tokenizer):
                return _bad("give --config CFG --raw-dir DIR, or --input FILE... "
                            "--output-prefix PREFIX --tokenizer MODEL")
            prefix = Path(args.output_prefix).absolute()
            outputs = [Output(prefix=prefix, inputs=tuple(Path(x) for x in args.input),
                              max_docs=args.max_docs, min_tokens=args.min_tokens)]
            tokenizer = Path(args.tokenizer)
            data_dir = Path(args.data_dir) if args.data_dir else prefix.parent
            manifest = None
        results = run(outputs, tokenizer, data_dir=data_dir, workers=args.workers,
                      skip_bad=args.skip_bad, progress=not args.no_progress, force=args.force,
                      append_eod=args.append_eod, manifest=manifest)
    except (DataError, ConfigError) as e:
        return _bad(str(e))
    describe(results, sys.stdout)
    if args.config:
        print(f"next: python -m llama31_405b data verify {args.config}")
    return 0


def verify(args) -> int:
    from ..data import DataError
    from ..data.verify import verify_data
    cfg = load_or_report(args.config, args.set)
    if cfg is None:
        return 2
    try:
        res = verify_data(cfg, full=args.full, write_manifest=args.write_manifest,
                          log=lambda m: print(m, file=sys.stderr), sets=args.set)
    except DataError as e:
        return _fail(str(e))
    print(f"data verified for {args.config} (documents end with EOD: "
          f"{'yes' if res['eod'] == 'appended' else 'no'})")
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
