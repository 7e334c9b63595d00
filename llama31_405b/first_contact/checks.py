"""The checks of first-contact, in order (package docstring): the GPU, Transformer Engine and its
recipe (or, without TE, Megatron's local layers in BF16), then the phases asked for."""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .fit import fits, slice_estimate
from .report import PHASES, Report, Timed
from .slice import (DEFAULT_CONFIG, GRAD_RTOL, LOCAL_SEQ_LENGTH, LOSS_RTOL, TE_SERIES,
                    choose_recipe, compare, ddp_buffers, differing, differing_cast, loaded_weights,
                    local_compute, slice_config, synthetic_datasets, system_of_gpu, weights)

if TYPE_CHECKING:   # torch, megatron-core and the training loop are imported where they are used
    import torch
    from megatron.core.distributed import DistributedDataParallel

    from ..config.schema import Config
    from ..train.loop import Run

REPLAY_SEED = 7_000_001
"""Seed of the synthetic batch of the replay-equals-eager check."""


def run_checks(config: str | Path = DEFAULT_CONFIG, *, layers: int = 1,
               seq_length: int | None = None, steps: int = 3, workdir: str | None = None,
               tracebacks: bool = False, phases: Collection[str] = ("slice", "dp2"),
               report_path: str | Path | None = None,
               budget_s: float | None = None, cpu: bool = False, system: str | None = None,
               ) -> Report:
    from ..config import launch_env, load_config
    from ..systems.device import cuda_visible
    rep = Report(tracebacks=tracebacks, path=report_path, budget_s=budget_s,
                 meta={"config": str(config), "phases": list(phases), "cpu": cpu})
    cfg = load_config(config, validate=False)
    asked_seq = seq_length     # the slices of other configs (fit.fitting_configs) use it too
    # the launcher's environment (allocator, NCCL, TE recipe knobs) before CUDA or TE start
    for k, v in launch_env(cfg).items():
        os.environ.setdefault(k, v)

    # -- gpu --------------------------------------------------------------------------------
    cap: tuple[int, int] | None = None
    if cpu:
        rep.not_run("gpu", "--cpu: the slice runs on the CPU with gloo (no CUDA graphs)")
        system = "cpu"
    elif not cuda_visible():
        rep.rest_not_run("no CUDA device visible (torch.cuda.is_available() is False)")
        return rep
    else:
        import torch
        props = torch.cuda.get_device_properties(0)
        cap = (props.major, props.minor)
        rep.passed("gpu", f"{props.name}, compute capability {cap[0]}.{cap[1]}, "
                          f"{props.total_memory / 2**30:.0f} GiB",
                   name=props.name, capability=f"{cap[0]}.{cap[1]}",
                   memory_gib=round(props.total_memory / 2**30, 1),
                   torch=torch.__version__, cuda=torch.version.cuda,
                   devices=torch.cuda.device_count())
        system = system or system_of_gpu(props.name)
    for phase, names in PHASES.items():
        if phase not in phases:
            rep.rest_not_run(f"phase {phase!r} not selected (--phases)", names)

    # -- transformer_engine / recipe --------------------------------------------------------
    compute, why = choose_recipe(cfg.precision.compute, cap)
    te = False
    if cpu:
        rep.not_run("transformer_engine", "--cpu: the CPU never uses Transformer Engine")
        rep.not_run("recipe", "needs Transformer Engine")
        compute = local_compute(cfg.precision.compute)
    else:
        if compute is not None:
            probe = slice_config(cfg, compute=compute, layers=layers,
                                 seq_length=cfg.model.seq_length, steps=steps, system=system,
                                 ckpt_dir="", gaf=False)
            for k, v in launch_env(probe).items():
                os.environ.setdefault(k, v)
        try:
            import transformer_engine
            version: object = getattr(transformer_engine, "__version__", "unknown")
            te = True
        except ImportError as e:
            compute = local_compute(cfg.precision.compute)
            rep.not_run("transformer_engine", f"Transformer Engine is not installed ({e}): the "
                        f"slice runs Megatron's local layers in {compute.upper()}")
            rep.not_run("recipe", "needs Transformer Engine")
        if te:
            if not str(version).startswith(TE_SERIES + "."):
                rep.failed("transformer_engine", f"version {version}; the project is verified "
                                                 f"against {TE_SERIES}.x (Dockerfile)")
            else:
                rep.passed("transformer_engine", f"version {version}", version=str(version))
    if compute is None:   # only with TE: without it the slice runs the local BF16 layers
        rep.not_run("recipe", why)
        rep.rest_not_run(f"needs a quantized recipe: {why}")
        return rep

    from ..model.builder import GRAD_ACCUM_FUSION_MODULE, _has_module
    gaf_wanted = cfg.performance.gradient_accumulation_fusion and not cpu
    gaf = gaf_wanted and _has_module(GRAD_ACCUM_FUSION_MODULE)
    if seq_length is None:
        seq_length = cfg.model.seq_length if te else min(cfg.model.seq_length, LOCAL_SEQ_LENGTH)
    scfg = slice_config(cfg, compute=compute, layers=layers, seq_length=seq_length, steps=steps,
                        system=system, ckpt_dir="", gaf=gaf, graphs=not cpu, keep_width=not cpu)
    if te:
        with Timed(rep, "recipe"):
            from ..precision.te_recipe import (require_te_env, transformer_config_kwargs,
                                                verify_te_recipe)
            require_te_env(scfg)
            verify_te_recipe(scfg)
            kw = transformer_config_kwargs(scfg)
            rep.passed("recipe", f"{why}; TransformerConfig " + ", ".join(
                f"{k}={kw[k]}" for k in ("fp4", "fp4_recipe", "fp8", "fp8_recipe")
                if kw.get(k) is not None))
        if not rep.ok("recipe"):
            rep.rest_not_run("needs the recipe check")
            return rep
    if cpu:
        rep.not_run("gradient_accumulation_fusion", "--cpu: a GPU-only setting")
    elif not gaf_wanted:
        rep.passed("gradient_accumulation_fusion", "off in the config")
    elif gaf:
        rep.passed("gradient_accumulation_fusion", f"on ({GRAD_ACCUM_FUSION_MODULE} importable)")
    elif te:
        rep.failed("gradient_accumulation_fusion",
                   f"on in the config but {GRAD_ACCUM_FUSION_MODULE} (Apex) is not importable: "
                   "training would be refused; the slice continues with it off")
    else:
        rep.not_run("gradient_accumulation_fusion",
                    f"needs Apex's {GRAD_ACCUM_FUSION_MODULE}, which this image lacks (the "
                    "project's Dockerfile builds it); the slice runs with it off")

    if "layer" in phases:
        if cpu:
            rep.rest_not_run("needs CUDA", PHASES["layer"])
        elif rep.afford(PHASES["layer"], 30, "the layer phase"):
            from .layer import run_layer_phase
            run_layer_phase(rep, cfg, system=system or "h200-sxm")
    # refused before anything is built when it cannot fit this machine's memory (module fit)
    slice_of = functools.partial(slice_estimate, te=te, cpu=cpu, cap=cap, layers=layers,
                                 seq_length=asked_seq, steps=steps, system=system)
    run_slice = "slice" in phases and rep.afford(PHASES["slice"], 90, "the slice")
    if run_slice and not fits(rep, "build", "the slice", slice_of, cfg, gpu=not cpu):
        rep.rest_not_run("needs the build check", PHASES["slice"])
        run_slice = False
    if run_slice:
        rep.meta["slice"] = {"compute": compute, "transformer_engine": te,
                             "seq_length": seq_length, "layers": layers, "steps": steps,
                             "hidden": scfg.model.hidden_size, "vocab": scfg.model.vocab_size}
        tmp = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="first_contact_"))
        scfg = dataclasses.replace(scfg, checkpoint=dataclasses.replace(scfg.checkpoint,
                                                                        ckpt_dir=str(tmp)))
        try:
            _run_slice(rep, scfg, tmp, te=te)
        finally:
            if not workdir:
                shutil.rmtree(tmp, ignore_errors=True)
    if "dp2" in phases and rep.afford(PHASES["dp2"], 90, "the DP 2 phase") and (
            fits(rep, "dp2_eval_sync", "the DP 2 phase",
                  functools.partial(slice_of, dp=2), cfg, gpu=not cpu, ranks=2)):
        from .dp2 import run_dp2_phase
        run_dp2_phase(rep, config, layers=layers, seq_length=seq_length, steps=steps,
                      cpu=cpu, system=system, compute=compute)
    return rep


def _run_slice(rep: Report, scfg: Config, tmp: Path, *, te: bool) -> None:
    import torch

    from ..checkpoint import format as ckpt_format
    from ..parallel.setup import seed_model_parallel, setup_parallel, teardown_parallel
    from ..systems.device import decide
    from ..train.loop import Run
    device = decide(scfg)
    ckpt = tmp / scfg.checkpoint.init
    initial: dict[str, torch.Tensor] = {}   # the weights as built (filled once the build passes)
    with Timed(rep, "build"):
        from ..model.builder import build_model
        setup_parallel(scfg, device=device)
        # the graph-safe RNG tracker the run will use (Megatron keeps the first tracker it makes)
        seed_model_parallel(1234, cuda_graphs=device.gpu)
        chunks = build_model(scfg, device=device)
        kinds = sorted({type(m).__name__ for c in chunks for m in c.modules()
                        if type(m).__module__.startswith("megatron.core.extensions.transformer_engine")})
        if te and not kinds:
            raise RuntimeError("the model has no Transformer Engine layers")
        if not te:
            if kinds:
                raise RuntimeError(f"Transformer Engine layers without Transformer Engine: {kinds}")
            kinds = sorted({type(m).__name__ for c in chunks for m in c.modules() if type(
                m).__name__ in ("ColumnParallelLinear", "RowParallelLinear", "DotProductAttention")})
        n = sum(p.numel() for c in chunks for p in c.parameters())
        initial = weights(chunks)
        rep.passed("build", f"{n / 1e9:.2f} B parameters, {scfg.model.num_layers} layer(s) at "
                            f"hidden {scfg.model.hidden_size}, FFN {scfg.model.ffn_hidden_size}, "
                            f"sequence {scfg.model.seq_length}, {scfg.precision.compute}; "
                            + ("TE modules: " if te else "Megatron local modules: ")
                            + ", ".join(kinds), parameters=n, modules=kinds,
                   **_memory(device.gpu))
    if not rep.ok("build"):
        rep.rest_not_run("needs the build check", PHASES["slice"])
        teardown_parallel()
        return
    with Timed(rep, "checkpoint_save"):
        ckpt_format.save(chunks, ckpt, scfg)
        size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
        rep.passed("checkpoint_save", f"{ckpt} ({size / 2**30:.2f} GiB)", bytes=size)
    del chunks
    teardown_parallel()
    if device.gpu:
        torch.cuda.empty_cache()
    if not rep.ok("checkpoint_save"):
        rep.rest_not_run("needs the checkpoint_save check", PHASES["slice"])
        return
    run = Run(scfg, seed=1234, hooks=[], init_checkpoint=str(ckpt),
              datasets=synthetic_datasets(scfg))
    loaded = loaded_weights(run)
    trace_calls(rep, run)
    try:
        _run_loop(rep, run, initial, loaded)
    finally:
        run.close()
        teardown_parallel()
        del run
        _release(device.gpu)


def _release(gpu: bool) -> None:
    """Free the slice's GPU memory (the graphs live in class attributes of megatron's
    wrapper) before another phase uses the GPU."""
    if not gpu:
        return
    import gc

    import torch
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper, StaticBufferLoader
    FullCudaGraphWrapper.cuda_graph = {"training": None, "validation": None}
    FullCudaGraphWrapper.result = {"training": None, "validation": None}
    StaticBufferLoader.static_buffers = {"training": [], "validation": []}
    gc.collect()
    torch.cuda.empty_cache()


def trace_calls(rep: Report, run: Run) -> None:
    """Log every forward/backward and evaluation call of `run` (warm-up, capture, replays)
    with its seconds (after a device synchronize) into the report's progress and into the
    figures of the check in progress: a hang names the call it hung in."""
    import time
    counts: dict[str, int] = {}

    def wrap(name: str) -> None:
        inner: Callable[..., object] = getattr(run, name)

        def traced(*a: object, **k: object) -> object:
            import torch
            i = counts[name] = counts.get(name, 0) + 1
            check = rep.current
            rep.progress(f"{name} call {i}")
            t0 = time.perf_counter()
            out = inner(*a, **k)
            if run.device.gpu:   # decided by the run's init, which makes these calls
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if check is not None:
                rep.checks[check].data.setdefault("calls", []).append([f"{name} {i}", round(dt, 4)])
            rep.log(f"{name} call {i}: {dt:.3f} s")
            return out
        setattr(run, name, traced)
    for name in ("_forward_backward", "_evaluate"):
        wrap(name)


def _memory(gpu: bool) -> dict[str, float]:
    if not gpu:
        return {}
    import torch
    return {"gpu_allocated_gib": round(torch.cuda.memory_allocated() / 2**30, 2),
            "gpu_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "gpu_reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 2)}


def _run_loop(rep: Report, run: Run, initial: dict[str, torch.Tensor],
              loaded: dict[str, torch.Tensor]) -> None:
    """The slice's checks from the load on. `initial`: the weights as built and saved (emptied
    once the load is checked); `loaded`: as the run held them after the load (loaded_weights)."""
    import torch

    from ..train.graphs import FullIterationGraphs
    from ..train.warmup import torch_optimizers
    slice_checks = PHASES["slice"]
    with Timed(rep, "checkpoint_load"):
        run._init()     # load, DDP, optimizer, graphs, warm-up, restore: the real init
        if not loaded:
            raise RuntimeError("the run's init never reached the warm-up: no weights as loaded")
        bad = differing_cast(loaded, initial)
        if bad:
            raise RuntimeError(f"after the checkpoint load {len(bad)} parameters differ from the "
                               f"saved ones (in the parameter's dtype): {bad[:4]}")
        cast = sorted({f"{initial[n].dtype} -> {t.dtype}".replace("torch.", "")
                       for n, t in loaded.items() if t.dtype != initial[n].dtype})
        initial.clear()
        rep.passed("checkpoint_load", "loaded as the initial checkpoint (once, in parallel; "
                                      "the warm-up restore reads the master weights): every "
                                      "weight as saved, in the parameter's dtype"
                   + (f" ({', '.join(cast)} by the BF16 wrapper)" if cast else "")
                   + "; init (load, warm-up, restore) took this check's seconds",
                   **_memory(run.device.gpu))
    if not rep.ok("checkpoint_load"):
        rep.rest_not_run("needs the checkpoint_load check", slice_checks)
        return
    gpu = run.device.gpu
    with Timed(rep, "warmup_and_graphs"):
        differ = differing(run.model, loaded)
        if differ:
            raise RuntimeError(f"after the warm-up restore {len(differ)} parameters differ from "
                               f"the weights as loaded: {differ[:4]}")
        state = [v for o in torch_optimizers(run.optimizer) for st in o.state.values()
                 for v in st.values() if torch.is_tensor(v)]
        if not state or any(bool(v.abs().sum() != 0) for v in state):
            raise RuntimeError("Adam state is missing or not zero after the warm-up restore")
        if gpu:
            captured = FullIterationGraphs.captured()
            if not all(captured.values()):
                raise RuntimeError(f"full-iteration CUDA graphs not captured in the warm-up: "
                                   f"{captured}")
            graphs = "training and evaluation graphs captured"
        else:
            graphs = "no CUDA graphs on the CPU"
        # what Transformer Engine chose in the warm-up (train.loop records it at every run's
        # start): its attention backend and the norm settings in effect
        kernels: dict[str, str | None] | None = getattr(run, "te_kernels", None) if gpu else None
        from ..precision.te_recipe import te_kernel_line
        rep.passed("warmup_and_graphs", f"{run.cfg.run.warmup_iters} warm-up steps with optimizer "
                   f"updates and {'2 evaluation passes' if run._graphs else 'an evaluation pass'}; "
                   f"{graphs}; weights bitwise as loaded "
                   "(dtype included), Adam state zero"
                   + (f"; {te_kernel_line(kernels)}" if kernels else ""),
                   **({"te_kernels": kernels} if kernels else {}))
    if not rep.ok("warmup_and_graphs"):
        rep.rest_not_run("needs the warmup_and_graphs check", slice_checks)
        return
    with Timed(rep, "replay_equals_eager"):
        replay_equals_eager(rep, run)
    with Timed(rep, "steps"):
        stats = [run.train_step() for _ in range(run.cfg.derived.max_steps)]
        bad_steps = [s for s in stats
                     if not (math.isfinite(s.loss) and math.isfinite(s.grad_norm))]
        if bad_steps:
            raise RuntimeError(f"non-finite loss or gradient norm: {bad_steps}")
        if not differing(run.model, loaded):
            raise RuntimeError("the optimizer steps left every weight unchanged")
        times = [s.step_time_s for s in stats]
        rep.passed("steps", "losses " + ", ".join(f"{s.loss:.4f}" for s in stats)
                   + f"; {sum(times) / len(times) * 1e3:.0f} ms/step (mean; the first includes "
                   "the loader's start)", losses=[s.loss for s in stats],
                   grad_norms=[s.grad_norm for s in stats], step_s=times, **_memory(gpu))
    if not rep.ok("steps"):
        rep.rest_not_run("needs the steps check", slice_checks)
        return
    with Timed(rep, "evaluation"):
        value = run.evaluate()
        if not math.isfinite(value):
            raise RuntimeError(f"evaluation gave {value}")
        rep.passed("evaluation", f"log perplexity {value:.4f} ("
                   + ("through the evaluation graph)" if gpu else "eager, CPU)"), value=value)
    from .profiling import profile_check     # last: its steps come after every other check's
    profile_check(rep, run)


def grad_buffers(model: Sequence[DistributedDataParallel]) -> list[torch.Tensor]:
    """Host copies of the DDP gradient buffers of every chunk."""
    out = []
    for m in model:
        for b in ddp_buffers(m):
            assert b.grad_data is not None   # allocated by the buffer's __init__
            out.append(b.grad_data.detach().to("cpu", copy=True))
    return out


def replay_equals_eager(rep: Report, run: Run) -> None:
    """A training step (forward/backward, no optimizer step) and an evaluation pass on one
    synthetic batch, each through its CUDA graph and then eagerly (Megatron's schedule called
    directly) on the same weights: losses and gradient buffers bitwise equal, else within
    LOSS_RTOL / GRAD_RTOL (stated in the detail). On the CPU both passes are eager."""
    import torch

    from ..train.batches import eval_microbatch_count, synthetic_microbatches
    from ..train.evaluation import eval_layout, evaluate
    from ..train.step import run_schedule
    cfg, gpu = run.cfg, run.device.gpu
    tokens = dict(seq_length=cfg.model.seq_length, vocab_size=cfg.model.vocab_size)
    mbs = synthetic_microbatches(cfg.derived.num_microbatches, mbs=cfg.batch.micro_batch_size,
                                 seed=REPLAY_SEED, **tokens)
    run._zero_grads()
    replay = run._forward_backward(mbs)
    g_replay = grad_buffers(run.model)
    run._zero_grads()
    eager = run_schedule(run.model, mbs, seq_length=cfg.model.seq_length,
                         mbs=cfg.batch.micro_batch_size, forward_only=False, cp=cfg.parallel.cp,
                         gpu=gpu, forward_backward=None)
    g_eager = grad_buffers(run.model)
    run._zero_grads()
    shard, eval_mbs, multiple = eval_layout(cfg, dp_rank=run.info.dp_rank, dp=run.info.dp_size)
    count = eval_microbatch_count(len(shard), eval_mbs, multiple)
    ebatch = synthetic_microbatches(count, mbs=eval_mbs, seed=REPLAY_SEED + 1, **tokens)
    ev_replay = run._evaluate(ebatch)
    ev_eager = evaluate(run.model, ebatch, cfg, last_stage=run.last_stage, tp_rank=0, gpu=gpu,
                        forward_only_fn=None)
    tl_same, tl_rel = compare(float(replay[0] / replay[1]), float(eager[0] / eager[1]))
    ev_same, ev_rel = compare(ev_replay, ev_eager)
    g_same, g_worst = True, 0.0
    for a, b in zip(g_replay, g_eager, strict=True):
        if not torch.equal(a, b):
            g_same = False
            top = float(b.float().abs().max())
            g_worst = max(g_worst, float((a.float() - b.float()).abs().max()) / max(top, 1e-30))
    data = dict(train_loss_replay=float(replay[0] / replay[1]),
                train_loss_eager=float(eager[0] / eager[1]), train_loss_bitwise=tl_same,
                train_loss_rel_diff=tl_rel, grads_bitwise=g_same, grads_rel_max_diff=g_worst,
                eval_loss_replay=ev_replay, eval_loss_eager=ev_eager, eval_loss_bitwise=ev_same,
                eval_loss_rel_diff=ev_rel, graphs=gpu)
    what = "graph replay vs eager" if gpu else "CPU: both passes eager (no CUDA graphs)"
    if tl_same and ev_same and g_same:
        rep.passed("replay_equals_eager", f"{what}: training loss, gradient buffers and "
                   f"evaluation loss bitwise equal (train {data['train_loss_eager']:.6f}, "
                   f"eval {ev_eager:.6f})", **data)
    elif tl_rel <= LOSS_RTOL and ev_rel <= LOSS_RTOL and g_worst <= GRAD_RTOL:
        rep.passed("replay_equals_eager", f"{what}: not bitwise, within tolerance (losses "
                   f"relative {max(tl_rel, ev_rel):.2e} <= 2^-20, gradients {g_worst:.2e} of the "
                   "largest <= 2^-7)", **data)
    else:
        rep.failed("replay_equals_eager", f"{what}: differ beyond tolerance (train loss "
                   f"{tl_rel:.2e}, eval loss {ev_rel:.2e}, gradients {g_worst:.2e}; tolerances "
                   "2^-20, 2^-20, 2^-7)", **data)
