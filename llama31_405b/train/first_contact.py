"""First contact with a GPU: the smallest slice of the real training path, on one GPU, each
check reported as passed, failed or not run (with the reason).

    python -m llama31_405b first-contact [--config CONFIG] [--json] [--layers 1] [--seq-length N]

The slice is the configured model at 405B width (hidden 16384, FFN 53248, 128 query / 8 KV heads,
from the config) with 1 transformer layer, TP = PP = CP = 1, MiniBS 2 of MBS 1, a 32,768-row
vocabulary (the 128,256-row embedding and output layer would need ~76 GB of training state on
their own), built by the project's builder with Transformer Engine layers and run by the
project's training loop (`train.loop.Run`): the configured recipe where the GPU has it (NVFP4
needs compute capability >= 10.0), otherwise FP8 (>= 8.9); full-iteration CUDA graphs; a
checkpoint saved, then loaded as the initial checkpoint; the warm-up (optimizer steps and
evaluation passes on synthetic tokens, graphs captured) and its in-place restore; training steps
with optimizer updates; an evaluation. Memory: 4.3 B parameters x 18 bytes (BF16 weight, FP32
gradient, FP32 master, two Adam moments) = 71 GiB plus activations for one layer; a second layer
adds 53 GiB, too tight for one H200's 139 GiB. Data: synthetic tokens; nothing is read from disk
but the checkpoint.

Checks, in order (a check whose prerequisite did not pass is not run, naming it):
gpu, transformer_engine, recipe, gradient_accumulation_fusion, build, checkpoint_save,
checkpoint_load, warmup_and_graphs, steps, evaluation. Exit status 1 when any check failed, 0
otherwise (also when checks were not run: on a machine without a GPU every check is "not run").
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"
CHECKS = ("gpu", "transformer_engine", "recipe", "gradient_accumulation_fusion", "build",
          "checkpoint_save", "checkpoint_load", "warmup_and_graphs", "steps", "evaluation")
TE_SERIES = "2.20"
VOCAB = 32768
NVFP4_CAPABILITY, FP8_CAPABILITY = (10, 0), (8, 9)
# planner system file of the GPU in hand (placement checks and peak numbers follow it)
_SYSTEM_OF_GPU = (("GB300", "gb300-nvl72"), ("GB200", "gb200-nvl72"), ("H200", "h200-sxm"),
                  ("H100", "h100-sxm"))


@dataclass
class Check:
    name: str
    status: str = "not run"
    """"passed", "failed" or "not run"."""
    detail: str = ""
    seconds: float = 0.0


class Report:
    def __init__(self, *, tracebacks: bool = False):
        self.checks = {n: Check(n) for n in CHECKS}
        self.tracebacks = tracebacks

    def passed(self, name: str, detail: str = "") -> None:
        self.checks[name].status, self.checks[name].detail = "passed", detail

    def failed(self, name: str, detail: str) -> None:
        self.checks[name].status, self.checks[name].detail = "failed", detail

    def not_run(self, name: str, reason: str) -> None:
        c = self.checks[name]
        if c.status == "not run" and not c.detail:
            c.detail = reason

    def rest_not_run(self, reason: str) -> None:
        for c in self.checks.values():
            if c.status == "not run" and not c.detail:
                c.detail = reason

    def ok(self, name: str) -> bool:
        return self.checks[name].status == "passed"

    @property
    def failures(self) -> int:
        return sum(c.status == "failed" for c in self.checks.values())

    def text(self) -> str:
        w = max(len(n) for n in CHECKS)
        return "\n".join(f"{c.name:<{w}}  {c.status:<7}  {c.detail}" + (
            f"  ({c.seconds:.1f} s)" if c.seconds else "") for c in self.checks.values())

    def as_json(self) -> str:
        return json.dumps([dataclasses.asdict(c) for c in self.checks.values()], indent=2)


def choose_recipe(configured: str, capability: tuple[int, int] | None) -> tuple[str | None, str]:
    """(compute precision to run, why). None: no quantized recipe on this GPU."""
    if capability is None:
        return None, "no CUDA device visible"
    cc = f"{capability[0]}.{capability[1]}"
    if configured == "nvfp4":
        if capability >= NVFP4_CAPABILITY:
            return "nvfp4", f"the configured NVFP4 recipe (compute capability {cc})"
        if capability >= FP8_CAPABILITY:
            return "fp8", (f"FP8 instead of the configured NVFP4: no NVFP4 hardware (compute "
                           f"capability {cc} < 10.0)")
        return None, f"no NVFP4 or FP8 hardware (compute capability {cc} < 8.9)"
    if configured == "fp8":
        if capability >= FP8_CAPABILITY:
            return "fp8", f"the configured FP8 recipe (compute capability {cc})"
        return None, f"no FP8 hardware (compute capability {cc} < 8.9)"
    return configured, f"the configured {configured} compute (no quantized recipe)"


def slice_config(cfg, *, compute: str, layers: int, seq_length: int, steps: int,
                 system: str | None, ckpt_dir: str, gaf: bool):
    """The one-GPU slice of `cfg` (module docstring)."""
    r = dataclasses.replace
    pr = cfg.precision
    nvfp4 = compute == "nvfp4"
    return r(
        cfg,
        model=r(cfg.model, num_layers=layers, vocab_size=VOCAB, seq_length=seq_length),
        parallel=r(cfg.parallel, tp=1, pp=1, vp=1, cp=1, sequence_parallel=False),
        batch=r(cfg.batch, minibs=2, micro_batch_size=1, eval_micro_batch_size=None),
        precision=r(pr, compute=compute, nvfp4_rht=pr.nvfp4_rht and nvfp4,
                    nvfp4_stochastic_rounding=pr.nvfp4_stochastic_rounding and nvfp4,
                    nvfp4_2d_weights=pr.nvfp4_2d_weights and nvfp4,
                    bf16_layers_at_start=0, bf16_layers_at_end=0),
        performance=r(cfg.performance, cuda_graphs="full_iteration", fp8_param_gather=False,
                      fp4_param_gather=False, tp_comm_overlap=False,
                      account_for_embedding_in_pipeline_split=False,
                      account_for_loss_in_pipeline_split=False,
                      gradient_accumulation_fusion=gaf),
        system=r(cfg.system, id=system or cfg.system.id, racks=1, gpus_per_rack=1,
                 rack_of_host={}),
        run=r(cfg.run, division="open", max_steps=steps, warmup_iters=3),
        eval=r(cfg.eval, samples=2, first_step=steps, interval_steps=steps, target=0.0),
        checkpoint=r(cfg.checkpoint, ckpt_dir=ckpt_dir, init="first-contact"),
        source=f"{cfg.source} (first-contact slice)")


class SyntheticTokens:
    """Random token ids in the datasets' format (train.batches.DTYPES), one fixed stream per
    index: the slice reads nothing from disk."""

    def __init__(self, *, vocab: int, seq_length: int, seed: int, length: int = 1 << 20):
        self.vocab, self.seq, self.seed, self.length = vocab, seq_length, seed, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        import torch
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        text = torch.randint(0, self.vocab, (self.seq + 1,), generator=g, dtype=torch.int64)
        return {"tokens": text[:-1].clone(), "labels": text[1:].clone(),
                "loss_mask": torch.ones(self.seq, dtype=torch.float32),
                "position_ids": torch.arange(self.seq, dtype=torch.int64)}


def _weights(chunks) -> dict:
    from ..model.builder import unwrap
    return {n: p.detach().to("cpu", copy=True) for c in chunks
            for n, p in unwrap(c).named_parameters()}


def _same(chunks, ref: dict) -> list[str]:
    """Names of the parameters that differ (bitwise) from `ref`."""
    from ..model.builder import unwrap
    return [n for c in chunks for n, p in unwrap(c).named_parameters()
            if not torch_equal(p.detach().cpu(), ref[n])]


def torch_equal(a, b) -> bool:
    import torch
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


class _Timed:
    def __init__(self, report: Report, name: str):
        self.report, self.name = report, name

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, typ, exc, tb):
        self.report.checks[self.name].seconds = time.perf_counter() - self.t0
        if exc is not None and not isinstance(exc, KeyboardInterrupt):
            detail = f"{typ.__name__}: {exc}"
            if self.report.tracebacks:
                detail += "\n" + "".join(traceback.format_exception(typ, exc, tb))
            self.report.failed(self.name, detail)
            return True
        return False


def run_checks(config: str | Path = DEFAULT_CONFIG, *, layers: int = 1,
               seq_length: int | None = None, steps: int = 3, workdir: str | None = None,
               tracebacks: bool = False) -> Report:
    rep = Report(tracebacks=tracebacks)
    from ..config import launch_env, load_config
    from ..systems.device import cuda_visible
    cfg = load_config(config, validate=False)
    # the launcher's environment (allocator, NCCL, TE recipe knobs) before CUDA or TE start
    for k, v in launch_env(cfg).items():
        os.environ.setdefault(k, v)

    # -- gpu --------------------------------------------------------------------------------
    if not cuda_visible():
        rep.rest_not_run("no CUDA device visible (torch.cuda.is_available() is False)")
        return rep
    import torch
    props = torch.cuda.get_device_properties(0)
    cap = (props.major, props.minor)
    rep.passed("gpu", f"{props.name}, compute capability {cap[0]}.{cap[1]}, "
                      f"{props.total_memory / 2**30:.0f} GiB")
    system = next((s for key, s in _SYSTEM_OF_GPU if key in props.name.upper()), None)

    # -- transformer_engine -----------------------------------------------------------------
    compute, why = choose_recipe(cfg.precision.compute, cap)
    if compute is not None:
        probe = slice_config(cfg, compute=compute, layers=layers, seq_length=cfg.model.seq_length,
                             steps=steps, system=system, ckpt_dir="", gaf=False)
        for k, v in launch_env(probe).items():
            os.environ.setdefault(k, v)
    try:
        import transformer_engine
        version = getattr(transformer_engine, "__version__", "unknown")
    except ImportError as e:
        rep.not_run("transformer_engine", f"Transformer Engine is not installed ({e})")
        rep.rest_not_run("no Transformer Engine")
        return rep
    if not str(version).startswith(TE_SERIES + "."):
        rep.failed("transformer_engine", f"version {version}; the project is verified against "
                                         f"{TE_SERIES}.x (Dockerfile)")
    else:
        rep.passed("transformer_engine", f"version {version}")

    # -- recipe -------------------------------------------------------------------------------
    if compute is None:
        rep.not_run("recipe", why)
        rep.rest_not_run(f"needs a quantized recipe: {why}")
        return rep
    from ..model.builder import GRAD_ACCUM_FUSION_MODULE, _has_module
    gaf_wanted = cfg.performance.gradient_accumulation_fusion
    gaf = gaf_wanted and _has_module(GRAD_ACCUM_FUSION_MODULE)
    seq = seq_length or cfg.model.seq_length
    tmp = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="first_contact_"))
    scfg = slice_config(cfg, compute=compute, layers=layers, seq_length=seq, steps=steps,
                        system=system, ckpt_dir=str(tmp), gaf=gaf)
    with _Timed(rep, "recipe"):
        from ..precision.te_recipe import require_te_env, transformer_config_kwargs, verify_te_recipe
        require_te_env(scfg)
        verify_te_recipe(scfg)
        kw = transformer_config_kwargs(scfg)
        rep.passed("recipe", f"{why}; TransformerConfig "
                   + ", ".join(f"{k}={kw[k]}" for k in ("fp4", "fp4_recipe", "fp8", "fp8_recipe")
                               if kw.get(k) is not None))
    if not rep.ok("recipe"):
        rep.rest_not_run("needs the recipe check")
        return rep
    if not gaf_wanted:
        rep.passed("gradient_accumulation_fusion", "off in the config")
    elif gaf:
        rep.passed("gradient_accumulation_fusion", f"on ({GRAD_ACCUM_FUSION_MODULE} importable)")
    else:
        rep.failed("gradient_accumulation_fusion",
                   f"on in the config but {GRAD_ACCUM_FUSION_MODULE} (Apex) is not importable: "
                   "training would be refused; the slice continues with it off")
    try:
        _run_slice(rep, scfg, tmp)
    finally:
        if not workdir:
            shutil.rmtree(tmp, ignore_errors=True)
    return rep


def _run_slice(rep: Report, scfg, tmp: Path) -> None:
    import torch

    from ..parallel.setup import seed_model_parallel, setup_parallel, teardown_parallel
    from ..systems.device import decide
    from ..checkpoint import format as ckpt_format
    from .loop import Run
    device = decide(scfg)
    ckpt = tmp / scfg.checkpoint.init
    initial = None
    with _Timed(rep, "build"):
        from ..model.builder import build_model
        setup_parallel(scfg, device=device)
        # the graph-safe RNG tracker the run will use (Megatron keeps the first tracker it makes)
        seed_model_parallel(1234, cuda_graphs=True)
        chunks = build_model(scfg, device=device)
        te_layers = sorted({type(m).__name__ for c in chunks for m in c.modules()
                            if type(m).__module__.startswith("megatron.core.extensions.transformer_engine")})
        if not te_layers:
            raise RuntimeError("the model has no Transformer Engine layers")
        n = sum(p.numel() for c in chunks for p in c.parameters())
        initial = _weights(chunks)
        rep.passed("build", f"{n / 1e9:.2f} B parameters, {scfg.model.num_layers} layer(s) at "
                            f"hidden {scfg.model.hidden_size}, FFN {scfg.model.ffn_hidden_size}; "
                            f"TE modules: {', '.join(te_layers)}")
    if not rep.ok("build"):
        rep.rest_not_run("needs the build check")
        teardown_parallel()
        return
    with _Timed(rep, "checkpoint_save"):
        ckpt_format.save(chunks, ckpt, scfg)
        size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
        rep.passed("checkpoint_save", f"{ckpt} ({size / 2**30:.1f} GiB)")
    del chunks
    teardown_parallel()
    torch.cuda.empty_cache()
    if not rep.ok("checkpoint_save"):
        rep.rest_not_run("needs the checkpoint_save check")
        return
    datasets = (SyntheticTokens(vocab=scfg.model.vocab_size, seq_length=scfg.model.seq_length,
                                seed=1),
                SyntheticTokens(vocab=scfg.model.vocab_size, seq_length=scfg.model.seq_length,
                                seed=2))
    run = Run(scfg, seed=1234, hooks=[], init_checkpoint=str(ckpt), datasets=datasets)
    try:
        _run_loop(rep, run, initial)
    finally:
        run.close()
        teardown_parallel()


def _run_loop(rep: Report, run, initial: dict) -> None:
    import torch

    from .graphs import FullIterationGraphs
    from .warmup import torch_optimizers
    with _Timed(rep, "checkpoint_load"):
        run._init()     # load, DDP, optimizer, graphs, warm-up, restore: the real init
        rep.passed("checkpoint_load", "loaded as the initial checkpoint (init, and again by "
                                      "the warm-up restore)")
    if not rep.ok("checkpoint_load"):
        rep.rest_not_run("needs the checkpoint_load check")
        return
    with _Timed(rep, "warmup_and_graphs"):
        differ = _same(run.model, initial)
        if differ:
            raise RuntimeError(f"after the warm-up restore {len(differ)} parameters differ from "
                               f"the checkpoint: {differ[:4]}")
        state = [v for o in torch_optimizers(run.optimizer) for st in o.state.values()
                 for v in st.values() if torch.is_tensor(v)]
        if not state or any(bool(v.abs().sum() != 0) for v in state):
            raise RuntimeError("Adam state is missing or not zero after the warm-up restore")
        captured = FullIterationGraphs.captured()
        if not all(captured.values()):
            raise RuntimeError(f"full-iteration CUDA graphs not captured in the warm-up: {captured}")
        rep.passed("warmup_and_graphs", f"{run.cfg.run.warmup_iters} warm-up steps with optimizer "
                   "updates and 2 evaluation passes; training and evaluation graphs captured; "
                   "weights bitwise the checkpoint's, Adam state zero")
    if not rep.ok("warmup_and_graphs"):
        rep.rest_not_run("needs the warmup_and_graphs check")
        return
    with _Timed(rep, "steps"):
        stats = [run.train_step() for _ in range(run.cfg.derived.max_steps)]
        bad = [s for s in stats if not (math.isfinite(s.loss) and math.isfinite(s.grad_norm))]
        if bad:
            raise RuntimeError(f"non-finite loss or gradient norm: {bad}")
        if not _same(run.model, initial):
            raise RuntimeError("the optimizer steps left every weight unchanged")
        rep.passed("steps", "losses " + ", ".join(f"{s.loss:.4f}" for s in stats)
                   + f"; {sum(s.step_time_s for s in stats) / len(stats) * 1e3:.0f} ms/step")
    if not rep.ok("steps"):
        rep.rest_not_run("needs the steps check")
        return
    with _Timed(rep, "evaluation"):
        value = run.evaluate()
        if not math.isfinite(value):
            raise RuntimeError(f"evaluation gave {value}")
        rep.passed("evaluation", f"log perplexity {value:.4f} (through the evaluation graph)")


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m llama31_405b first-contact",
                                description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def add_arguments(p) -> None:
    p.add_argument("--config", default=str(DEFAULT_CONFIG),
                   help="the config whose model, recipe and performance settings are sliced")
    p.add_argument("--layers", type=int, default=1,
                   help="transformer layers (1: ~71 GiB of weights and optimizer state; each more adds 53 GiB)")
    p.add_argument("--seq-length", type=int, default=None,
                   help="sequence length (default: the config's)")
    p.add_argument("--steps", type=int, default=3, help="timed training steps")
    p.add_argument("--workdir", default=None, help="where the checkpoint goes (default: a "
                   "temporary directory, removed afterwards)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument("--traceback", action="store_true",
                   help="add the Python traceback to a failed check's detail")


def run(args) -> int:
    rep = run_checks(args.config, layers=args.layers, seq_length=args.seq_length,
                     steps=args.steps, workdir=args.workdir, tracebacks=args.traceback)
    print(rep.as_json() if args.json else rep.text())
    if not args.json:
        print(f"\n{rep.failures} failed, "
              f"{sum(c.status == 'passed' for c in rep.checks.values())} passed, "
              f"{sum(c.status == 'not run' for c in rep.checks.values())} not run",
              file=sys.stderr)
    return 1 if rep.failures else 0


if __name__ == "__main__":
    sys.exit(main())
