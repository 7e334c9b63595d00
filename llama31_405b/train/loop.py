"""The training run, explicit: init (everything before run_start), then steps, evaluations at the
rules' steps, and a stop at the target (status success) or at max steps (status aborted).

    run = Run(cfg, seed=..., hooks=[...])
    status = run.execute()      # "success" | "aborted"; run_stop is always logged

Init, in order (all before run_start, MLPerf "init"): device decision -> process groups ->
placement check -> the cheap checks of the inputs (train.inputs: the data's manifest, tokenizer,
files and sizes, the checkpoint's record; no tensor, nothing of the dataset's contents) -> seeds
-> model build -> initial checkpoint load -> DDP + distributed
optimizer -> datasets and their index caches -> CUDA graph wrappers -> warm-up on synthetic
tokens (training steps with optimizer updates, evaluation passes; train.warmup) and the in-place
restore (from the master weights: the checkpoint is read once) -> manual GC start. After
run_start a loader thread (train.prefetch) reads the next step's batch while the current one
computes.

What the init builds (the device, the process groups' ParallelInfo, the model chunks, the
optimizer, the schedule, the datasets) is declared on `Run` with its type and assigned by
`_init`: the hooks' `on_init_start` sees none of it, everything after the init sees all of it.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .failure import (RunAborted, SignalWatch, StopRequest, check_finite, lost_peer,
                      lost_rank_reason)
from .hooks import Hook, Hooks, StepStats
from .manual_gc import ManualGC
from .schedule import LRSchedule

if TYPE_CHECKING:   # megatron.core is imported by the init, after the TE environment check
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer import MegatronOptimizer
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.cuda_graphs import TECudaGraphHelper

    from ..config.schema import Config
    from ..parallel.distributed import DistEnv
    from ..parallel.setup import ParallelInfo
    from ..systems.device import Device
    from .failure import StopPoint
    from .graphs import FullIterationGraphs
    from .inputs import CheckedInputs
    from .prefetch import Prefetcher
    from .protocols import Microbatch, Samples


def te_env_checked(cfg: Config, device: Device, *, te_installed: bool | None = None) -> bool:
    """Whether a run checks Transformer Engine's environment (precision.te_recipe.require_te_env:
    the recipe knobs and the kernel-choice knobs, attention backend and cuDNN norms included)
    before TE is imported: every GPU run with TE's layers, BF16 included (model.builder takes
    them on a GPU whenever TE is installed), and every fp8/nvfp4 GPU run (which model.builder
    refuses without TE). `te_installed`: whether transformer_engine is importable (default: ask
    the import system without importing it)."""
    if not device.gpu:
        return False
    if cfg.precision.compute in ("fp8", "nvfp4"):
        return True
    if te_installed is None:
        from ..model.builder import _has_module
        te_installed = _has_module("transformer_engine")
    return te_installed


@dataclass
class RunState:
    step: int = 0
    samples: int = 0
    init_stopped: bool = False
    run_started: bool = False
    evals: list[tuple[int, int, float]] = field(default_factory=list)
    """(step, samples, log perplexity) of every evaluation."""
    losses: list[float] = field(default_factory=list)
    status: str | None = None
    reason: str = ""
    run_start_ms: int | None = None
    """Wall clock of run_start (ms since the epoch): the MLPerf log's run_start time_ms."""
    stop_agreed: bool = False
    """Some rank asked to stop (signal, log failure): known to every rank after a step's all-reduce."""


class Run:
    # built by _init, in this order (MLPerf init); read only after it
    device: Device
    info: ParallelInfo
    model: list[DistributedDataParallel]
    """The model chunks of this rank (one per virtual pipeline stage), in Megatron's DDP."""
    optimizer: MegatronOptimizer
    schedule: LRSchedule
    last_stage: bool
    train_ds: Samples
    """The training blend (data.datasets, or the caller's `datasets`): indexed by sample."""
    valid_ds: Samples
    te_kernels: dict[str, str | None]
    """GPU: what chose the TE kernels (precision.te_recipe.te_kernel_record), after the warm-up."""
    cuda_graph_helper: TECudaGraphHelper
    """Per-layer CUDA graphs ("layers") only: megatron-core's helper that captured them."""

    def __init__(self, cfg: Config, *, seed: int, hooks: list[Hook],
                 dist_env: DistEnv | None = None, timeout_s: float = 600.0,
                 signal_grace_s: float = 20.0, init_checkpoint: str | None = None,
                 datasets: tuple[Samples, Samples] | None = None,
                 sets: Sequence[str] = ()) -> None:
        self.cfg, self.seed = cfg, seed
        self.sets = tuple(sets)
        """The user's --set overrides: carried into the commands that messages suggest."""
        self.hooks = Hooks(hooks)
        self.dist_env, self.timeout_s = dist_env, timeout_s
        self.signal_grace_s = signal_grace_s
        self.init_checkpoint = init_checkpoint
        self._datasets = datasets
        self.state = RunState()
        self.stop = StopRequest()
        self.gc = ManualGC.from_config(cfg)
        self._graphs: FullIterationGraphs | None = None   # with full-iteration graphs
        self._loader: Prefetcher[list[Microbatch]] | None = None   # started by the first step
        self._init_ckpt = ""
        self.failure: BaseException | None = None
        """The exception that ended the run (None: it ended by itself or by RunAborted)."""
        # train.warmup.quantized_values after the load
        self._quantized_init: dict[torch.nn.Parameter, torch.Tensor] = {}

    # state shortcuts used by hooks
    @property
    def step(self) -> int:
        return self.state.step

    @property
    def samples(self) -> int:
        return self.state.samples

    @property
    def run_started(self) -> bool:
        return self.state.run_started

    # -- init -----------------------------------------------------------------------------------
    def _init(self) -> None:
        from .. import cpu_compat
        from ..systems.device import decide
        cfg = self.cfg
        self.device = device = decide(cfg)      # refuses a GPU config without a GPU
        gpu_quant = device.gpu and cfg.precision.compute in ("fp8", "nvfp4")
        if te_env_checked(cfg, device):
            # TE reads the recipe knobs from the environment when it is imported (and
            # megatron.core imports it), its kernel choices (attention backend, cuDNN norms) in
            # BF16 too: check them before the first megatron import
            from ..precision.te_recipe import require_te_env
            require_te_env(cfg)
        cpu_compat.apply(device)
        from ..model.builder import (build_model, gradient_accumulation_fusion,
                                     optimizer_config, wrap_for_training)
        gradient_accumulation_fusion(cfg, device)   # refused before any process group exists
        from ..parallel.setup import seed_model_parallel, setup_parallel
        from megatron.core import parallel_state as ps
        from megatron.core.optimizer import get_megatron_optimizer
        self.info = setup_parallel(cfg, self.dist_env, timeout_s=self.timeout_s, device=device)
        self._check_placement()
        from .inputs import check_inputs
        self._inputs: CheckedInputs = check_inputs(cfg, init_checkpoint=self.init_checkpoint, sets=self.sets,
                                    data=self._datasets is None)
        seed_model_parallel(self.seed,
                            cuda_graphs=device.gpu and cfg.performance.cuda_graphs != "none")
        if device.gpu and cfg.performance.tp_comm_overlap:
            self._init_tp_comm_overlap()
        chunks = build_model(cfg, device=device)
        if gpu_quant:
            from ..precision.te_recipe import verify_te_recipe
            verify_te_recipe(cfg)
        ckpt = self._init_ckpt = self._inputs.checkpoint
        if ckpt:
            from ..checkpoint import format as ckpt_format
            from .warmup import quantized_values
            ckpt_format.load(chunks, ckpt, cfg)    # read once, in parallel: never again
            self._quantized_init = quantized_values(chunks)   # fp8/fp4 params only (warm-up)
        self.model = wrap_for_training(cfg, chunks)
        # megatron-core 0.19.2 annotates model_chunks List[MegatronModule], which is invariant:
        # its DistributedDataParallel is a MegatronModule, and the function only reads the list
        self.optimizer = get_megatron_optimizer(optimizer_config(cfg),
                                                self.model)  # type: ignore[arg-type]
        if not device.gpu and cfg.parallel.cp == 1:   # CP's RoPE split pins memory in forward
            cpu_compat.fast_paths(self.model, self.optimizer)
        self.schedule = LRSchedule.from_config(cfg)
        self.last_stage = ps.is_pipeline_last_stage(ignore_virtual=True)
        self.train_ds, self.valid_ds = self._build_datasets()
        tcfg = chunks[0].config
        if tcfg.cuda_graph_impl == "full_iteration":
            from .graphs import FullIterationGraphs
            self._graphs = FullIterationGraphs(cfg, tcfg)
        self._warmup_and_restore(tcfg)
        if device.gpu:   # what TE chose in the warm-up and the norm settings in effect
            from ..precision.te_recipe import te_kernel_line, te_kernel_record
            self.te_kernels = te_kernel_record()
            if self.info.is_rank0 and "transformer_engine" in sys.modules:
                print(f"[train] {te_kernel_line(self.te_kernels)}", file=sys.stderr, flush=True)

    def _init_tp_comm_overlap(self) -> None:
        """Transformer Engine userbuffers for TP communication/GEMM overlap (GPU), created
        before the TE layers, for activations of [seq/CP x MBS, hidden] (Megatron's sizing in
        megatron/training/initialize.py _initialize_tp_communicators), one communicator set per
        quantization mode (TE 2.20.2 module/base.py initialize_ub; `use_fp8` is deprecated)."""
        from transformer_engine.pytorch import module as te_module

        from ..precision.te_recipe import ub_quantization_modes
        cfg = self.cfg
        modes = [te_module.base.UserBufferQuantizationMode[m] for m in ub_quantization_modes(cfg)]
        shape = [cfg.model.seq_length * cfg.batch.micro_batch_size // cfg.parallel.cp,
                 cfg.model.hidden_size]
        te_module.base.initialize_ub(
            shape=shape, tp_size=cfg.parallel.tp, quantization_modes=modes,
            dtype=torch.bfloat16 if cfg.precision.params == "bf16" else torch.float32,
            bootstrap_backend="nccl")

    def _check_placement(self) -> None:
        """THE placement call site: every TP/CP/PP group inside one rack, checked right after
        process-group setup, before the model is built or a checkpoint is read (raises
        PlacementError, which the train command turns into exit code 3)."""
        from ..parallel.placement import check_placement
        check_placement(self.cfg, self.info.dist_env)

    def _build_datasets(self) -> tuple[Samples, Samples]:
        if self._datasets is not None:
            return self._datasets
        from ..data.datasets import build_datasets
        d = self.cfg.derived   # the data was checked first (train.inputs, self._inputs)
        return build_datasets(self.cfg, seed=self.seed, train_samples=d.max_steps * d.gbs,
                              verified=self._inputs.verified)

    def _warmup_and_restore(self, tcfg: TransformerConfig) -> None:
        """Warm-up on synthetic tokens, then per-layer graph capture ("layers"), then
        everything put back in place (train.warmup)."""
        from .warmup import RestorePoint
        layers = tcfg.cuda_graph_impl == "transformer_engine"
        if not self.cfg.run.warmup_iters and not layers:
            return
        point = RestorePoint.capture(self.model, self.optimizer, gpu=self.device.gpu,
                                     quantized=self._quantized_init)
        if self.cfg.run.warmup_iters:
            self._warmup(self.cfg.run.warmup_iters)
        if layers:
            from .graphs import capture_layer_graphs
            self.cuda_graph_helper = capture_layer_graphs(
                self.cfg, self.model, self.optimizer, tcfg, rank=self.info.dist_env.rank)
        point.restore(self.model, self.optimizer)
        self._quantized_init = {}

    def _warmup(self, iters: int) -> None:
        """`iters` training iterations (forward/backward, gradient reduction, optimizer step at
        the first update's LR) and the evaluation passes the graphs need (two with
        full-iteration graphs: eager, then captured), all on synthetic microbatches of the real
        count and shapes. The caller restores the state."""
        from .batches import eval_microbatch_count, synthetic_microbatches
        from .evaluation import eval_layout
        from .graphs import EVAL_CAPTURE_PASS
        from .warmup import WARMUP_SEED
        cfg = self.cfg
        tokens = dict(seq_length=cfg.model.seq_length, vocab_size=cfg.model.vocab_size)
        for i in range(iters):
            mbs = synthetic_microbatches(cfg.derived.num_microbatches,
                                         mbs=cfg.batch.micro_batch_size,
                                         seed=WARMUP_SEED + i, **tokens)
            self._zero_grads()
            self._forward_backward(mbs)
            self.schedule.apply(self.optimizer, 0)
            self.optimizer.step()
        shard, eval_mbs, multiple = eval_layout(cfg, dp_rank=self.info.dp_rank,
                                                dp=self.info.dp_size)
        count = eval_microbatch_count(len(shard), eval_mbs, multiple)
        for j in range(EVAL_CAPTURE_PASS + 1 if self._graphs else 1):
            self._evaluate(synthetic_microbatches(count, mbs=eval_mbs,
                                                  seed=WARMUP_SEED - 1 - j, **tokens))

    # -- one step -------------------------------------------------------------------------------
    def _zero_grads(self) -> None:
        for m in self.model:
            m.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _read_train_batch(self, step: int) -> list[Microbatch]:
        """Step `step`'s microbatches of this DP rank (runs in the loader thread)."""
        from .batches import train_microbatches
        cfg = self.cfg
        mbs = train_microbatches(self.train_ds, step=step, gbs=cfg.derived.gbs,
                                 minibs=cfg.batch.minibs, mbs=cfg.batch.micro_batch_size,
                                 dp_rank=self.info.dp_rank)
        if self.device.gpu:   # page-locked: the copy to the GPU overlaps
            mbs = [{k: v.pin_memory() for k, v in mb.items()} for mb in mbs]
        return mbs

    def _train_batch(self, step: int) -> list[Microbatch]:
        if self._loader is None:
            from .prefetch import Prefetcher
            from ..data.errors import DataError
            self._loader = Prefetcher(self._read_train_batch, start=step,
                                      stop=self.cfg.derived.max_steps, keep_types=(DataError,))
        return self._loader.get(step)

    def close(self) -> None:
        """Stop the loader thread (end of the run, also after a failure)."""
        if self._loader is not None:
            self._loader.close()

    def _forward_backward(self, microbatches: list[Microbatch]) -> torch.Tensor:
        from .step import run_schedule
        cfg = self.cfg
        return run_schedule(self.model, microbatches, seq_length=cfg.model.seq_length,
                            mbs=cfg.batch.micro_batch_size, forward_only=False,
                            cp=cfg.parallel.cp, gpu=self.device.gpu,
                            forward_backward=self._graphs.train if self._graphs else None)

    def train_step(self) -> StepStats:
        from .step import global_sum
        t0 = time.perf_counter()
        k = self.state.step
        batch = self._train_batch(k)
        self._zero_grads()
        local = self._forward_backward(batch)
        lr = self.schedule.apply(self.optimizer, k)
        _ok, grad_norm, _zeros = self.optimizer.step()
        # the loss sums carry every rank's stop request: all ranks stop after the same step
        total = global_sum(local, contributes=self.last_stage and self.info.tp_rank == 0,
                           gpu=self.device.gpu, flags=(float(self.stop.requested),))
        self.state.stop_agreed = bool(total[2] > 0)
        if self.device.gpu:
            torch.cuda.synchronize()
        loss = float(total[0] / total[1]) if total[1] > 0 else float("nan")
        self.state.step = k + 1
        self.state.samples = self.state.step * self.cfg.derived.gbs
        self.state.losses.append(loss)
        gn = float(grad_norm) if grad_norm is not None else float("nan")
        check_finite(self.state.step, loss, gn)
        return StepStats(step=self.state.step, samples=self.state.samples, loss=loss, lr=lr,
                         grad_norm=gn, step_time_s=time.perf_counter() - t0,
                         next_eval_step=self.next_eval_step(self.state.step))

    def next_eval_step(self, step: int) -> int:
        d = self.cfg.derived
        if step < d.first_eval_step:
            return d.first_eval_step
        n = -(-(step - d.first_eval_step) // d.eval_interval_steps)
        nxt = d.first_eval_step + n * d.eval_interval_steps
        return nxt if nxt > step else nxt + d.eval_interval_steps

    def is_eval_step(self, step: int) -> bool:
        d = self.cfg.derived
        return step >= d.first_eval_step and (step - d.first_eval_step) % d.eval_interval_steps == 0

    def evaluate(self) -> float:
        """Validation log perplexity of the current weights (reads the validation data)."""
        from .evaluation import eval_batches
        return self._evaluate(eval_batches(self.valid_ds, self.cfg, dp_rank=self.info.dp_rank,
                                           dp=self.info.dp_size))

    def _evaluate(self, microbatches: list[Microbatch]) -> float:
        from megatron.core import parallel_state as ps

        from .evaluation import evaluate
        return evaluate(self.model, microbatches, self.cfg, last_stage=self.last_stage,
                        tp_rank=ps.get_tensor_model_parallel_rank(), gpu=self.device.gpu,
                        forward_only_fn=self._graphs.eval if self._graphs else None)

    # -- the run --------------------------------------------------------------------------------
    def request_stop(self, reason: str, *, error: bool = False) -> None:
        """Stop every rank at the next step boundary (any thread). error: the run can no longer
        succeed (e.g. its MLPerf log cannot be written)."""
        self.stop.request(reason, error=error)

    def _where(self) -> tuple[int, int]:
        return self.state.step, self.state.samples

    @property
    def stop_point(self) -> StopPoint | None:
        """train.failure.StopPoint: where and why the run stopped (None while it runs). The
        MLPerf log's run_stop and the console's summary report it."""
        return self.stop.point

    def _on_signal(self, reason: str) -> None:
        # the signal watchdog thread: run_stop aborted now (unless the target was reached or
        # the stop is settled already), then the loop stops with the other ranks at the next step
        self.stop.signal(reason, lambda r: self.hooks.on_signal(self, r), self._where)

    def execute(self) -> str:
        watch = SignalWatch(on_signal=self._on_signal, grace_s=self.signal_grace_s).install()
        status, reason = "aborted", ""
        try:
            self.hooks.on_init_start(self)
            self._init()
            self.gc.start()
            self._stop_if_requested(agreed=False)
            self.hooks.on_init_stop(self)
            self.state.init_stopped = True
            self.state.run_start_ms = int(time.time() * 1e3)
            self.hooks.on_run_start(self)
            self.state.run_started = True
            status, reason = self._train()
        except RunAborted as e:
            reason = str(e)
            self.stop.settle(status, reason, self._where)
        except BaseException as e:  # noqa: BLE001 - any failure must end in run_stop aborted,
            # torch's CheckpointException (a BaseException) included; the caller reports it
            # (llama31_405b.failures: one error line, the traceback only under --debug)
            from ..failures import describe
            reason = describe(e)
            if lost_peer(e):          # settled now: torchrun's SIGTERM follows the dead rank
                reason = lost_rank_reason(e, reason)
            self.stop.settle(status, reason, self._where)
            self.failure = e
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            self.close()
            self.gc.stop()
            watch.done.set()
            # the first cause known holds: a signal logged at once, else this ending
            point = self.stop.settle(status, reason, self._where)
            status, reason = point.status, point.reason
            self.state.status, self.state.reason = status, reason
            self.hooks.on_run_stop(self, status, reason)
            watch.uninstall()
        return status

    def _stop_if_requested(self, *, agreed: bool = True) -> None:
        """agreed: the stop every rank learnt from the last step's all-reduce; else this rank's
        own request (init, where no step agrees on it)."""
        if self.state.stop_agreed if agreed else self.stop.requested:
            raise RunAborted(self.stop.reason or "stopped with the other ranks: another rank "
                                                 "received a signal or could not write its log")

    def _test_delay(self, seconds: float) -> None:
        """TEST ONLY (config [testing]): slow a step or an evaluation down on purpose."""
        if seconds > 0:
            time.sleep(seconds)

    def _train(self) -> tuple[str, str]:
        d = self.cfg.derived
        testing = self.cfg.testing
        if (testing.step_delay_s or testing.eval_delay_s) and self.info.is_rank0:
            print(f"[train] TEST ONLY: testing.step_delay_s {testing.step_delay_s} s "
                  f"(ranks {testing.step_delay_ranks or 'all'}), "
                  f"testing.eval_delay_s {testing.eval_delay_s} s slow this run down",
                  file=sys.stderr, flush=True)
        block_start_step = 0
        self.hooks.on_block_start(self, 0, self._block_len(0))
        while self.state.step < d.max_steps:
            self._test_delay(testing.step_delay_on(self.info.dist_env.rank))
            stats = self.train_step()
            self.hooks.on_step_end(self, stats)
            self._stop_if_requested()
            step = self.state.step
            self.gc.after_train_step(step)
            if self.is_eval_step(step):
                self.hooks.on_block_stop(self, step, (step - block_start_step) * d.gbs)
                self.hooks.on_eval_start(self, step)
                t0 = time.perf_counter()
                self._test_delay(testing.eval_delay_s)
                value = self.evaluate()
                self.gc.after_eval()
                self.state.evals.append((step, self.state.samples, value))
                self.hooks.on_eval_end(self, step, value, time.perf_counter() - t0)
                if value <= d.target:
                    if self.stop.finish():   # not if a signal or a failed log write came first
                        return "success", ""
                    raise RunAborted(self.stop.reason)
                if step < d.max_steps:
                    block_start_step = step
                    self.hooks.on_block_start(self, step, self._block_len(step))
        if not self.is_eval_step(self.state.step):
            self.hooks.on_block_stop(self, self.state.step,
                                     (self.state.step - block_start_step) * d.gbs)
        return "aborted", f"target {d.target} not reached in {d.max_steps} steps"

    def _block_len(self, step: int) -> int:
        d = self.cfg.derived
        return (min(self.next_eval_step(step), d.max_steps) - step) * d.gbs
