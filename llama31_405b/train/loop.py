"""The training run, explicit: init (everything before run_start), then steps, evaluations at the
rules' steps, and a stop at the target (status success) or at max steps (status aborted).

    run = Run(cfg, seed=..., hooks=[...])
    status = run.execute()      # "success" | "aborted"; run_stop is always logged

Init, in order (all before run_start, MLPerf "init"): process groups -> placement check ->
seeds -> model build -> initial checkpoint load -> DDP + distributed optimizer -> datasets and
their index caches -> optional warm-up iterations (state restored).
"""
from __future__ import annotations

import gc
import sys
import time
import traceback
from dataclasses import dataclass, field

import torch

from .failure import RunAborted, SignalWatch, StopRequest, check_finite
from .hooks import Hook, Hooks, StepStats
from .schedule import LRSchedule


@dataclass
class RunState:
    step: int = 0
    samples: int = 0
    init_stopped: bool = False
    run_started: bool = False
    evals: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    status: str | None = None
    reason: str = ""
    stop_agreed: bool = False
    """Some rank asked to stop (signal, log failure): known to every rank after a step's all-reduce."""


class Run:
    def __init__(self, cfg, *, seed: int, hooks: list[Hook], dist_env=None,
                 timeout_s: float = 600.0, signal_grace_s: float = 20.0,
                 init_checkpoint: str | None = None, datasets=None):
        self.cfg, self.seed = cfg, seed
        self.hooks = Hooks(hooks)
        self.dist_env, self.timeout_s = dist_env, timeout_s
        self.signal_grace_s = signal_grace_s
        self.init_checkpoint = init_checkpoint
        self._datasets = datasets
        self.state = RunState()
        self.stop = StopRequest()
        self.info = None
        self.model = None
        self.optimizer = None

    # state shortcuts used by hooks
    @property
    def step(self):
        return self.state.step

    @property
    def samples(self):
        return self.state.samples

    @property
    def run_started(self):
        return self.state.run_started

    @property
    def init_stopped(self):
        return self.state.init_stopped

    # -- init -----------------------------------------------------------------------------------
    def _init(self):
        gpu_quant = torch.cuda.is_available() and self.cfg.precision.compute in ("fp8", "nvfp4")
        if gpu_quant:
            # TE reads the NVFP4 recipe knobs from the environment when it is imported (and
            # megatron.core imports it): check them before the first megatron import
            from ..precision.te_recipe import require_te_env
            require_te_env(self.cfg)
        from ..model.builder import build_model, optimizer_config, wrap_for_training
        from ..parallel.setup import seed_model_parallel, setup_parallel
        from megatron.core import parallel_state as ps
        from megatron.core.optimizer import get_megatron_optimizer
        cfg = self.cfg
        self.info = setup_parallel(cfg, self.dist_env, timeout_s=self.timeout_s)
        self._check_placement()
        seed_model_parallel(self.seed, cuda_graphs=cfg.performance.cuda_graphs != "none")
        if torch.cuda.is_available() and cfg.performance.tp_comm_overlap:
            self._init_tp_comm_overlap()
        chunks = build_model(cfg)
        if gpu_quant:
            from ..precision.te_recipe import verify_te_recipe
            verify_te_recipe(cfg)
        ckpt = self.init_checkpoint
        if ckpt is None:
            from pathlib import Path
            ckpt = str(Path(cfg.checkpoint.ckpt_dir) / cfg.checkpoint.init)
        if ckpt:
            from .checkpoint import load_model_checkpoint
            load_model_checkpoint(chunks, ckpt, cfg)
        self.model = wrap_for_training(cfg, chunks)
        self.optimizer = get_megatron_optimizer(optimizer_config(cfg), self.model)
        self.schedule = LRSchedule.from_config(cfg)
        self.last_stage = ps.is_pipeline_last_stage(ignore_virtual=True)
        self.train_ds, self.valid_ds = self._build_datasets()
        if cfg.run.warmup_iters:
            self._warmup(cfg.run.warmup_iters)
        if chunks[0].config.cuda_graph_impl == "transformer_engine":
            self._capture_cuda_graphs(chunks[0].config)

    def _init_tp_comm_overlap(self):
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

    def _capture_cuda_graphs(self, tcfg):
        """Per-layer CUDA graphs (Transformer Engine make_graphed_callables), captured once
        before run_start, after the warm-up iterations, as Megatron's own training loop does
        (megatron/training/training.py, train(): capture at iteration == cuda_graph_warmup_steps).

        TECudaGraphHelper reads the number of microbatches per step from Megatron's global
        microbatch calculator (megatron/core/transformer/cuda_graphs.py
        _get_cuda_graph_input_data and the num_warmup_iters formula), which this project's
        schedule does not otherwise use: it is configured here from cfg (GBS, MBS, DP), so one
        graph per layer and microbatch of the interleaved schedule is captured. The DDP
        parameter-gather pre-hooks are off during capture (without the forced synchronous
        gather: Megatron passes param_sync=False) and the graphed layers get manual hooks."""
        from megatron.core.transformer.cuda_graphs import TECudaGraphHelper

        from .step import configure_num_microbatches
        configure_num_microbatches(self.cfg, rank=torch.distributed.get_rank())
        helper = TECudaGraphHelper(model=self.model, config=tcfg,
                                   seq_length=self.cfg.model.seq_length,
                                   micro_batch_size=self.cfg.batch.micro_batch_size,
                                   optimizers=[self.optimizer])
        overlap_gather = self.cfg.performance.overlap_param_gather and self.cfg.optimizer.distributed
        if overlap_gather:
            for m in self.model:
                m.disable_forward_pre_hook(param_sync=False)
        helper.create_cudagraphs()
        if overlap_gather:
            for m in self.model:
                m.enable_forward_pre_hook()
            helper.cuda_graph_set_manual_hooks()
        self.cuda_graph_helper = helper

    def _check_placement(self):
        """THE placement call site: every TP/CP/PP group inside one rack, checked right after
        process-group setup, before the model is built or a checkpoint is read (raises
        PlacementError, which the train command turns into exit code 3)."""
        from ..parallel.placement import check_placement
        check_placement(self.cfg, self.info.dist_env)

    def _build_datasets(self):
        if self._datasets is not None:
            return self._datasets
        from ..data.datasets import build_datasets
        if self.cfg.data.require_verified:
            from ..data.verify import verify_data
            verify_data(self.cfg)
        d = self.cfg.derived
        return build_datasets(self.cfg, seed=self.seed, train_samples=d.max_steps * d.gbs)

    def _warmup(self, iters: int):
        """Untimed forward/backward + gradient reduction on the first batches, to build kernels,
        buffers and communicators before run_start. No optimizer update: weights and optimizer
        state stay untouched; RNG states are restored; data position is a function of the step
        only, so nothing else moves."""
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
        tracker = get_cuda_rng_tracker().get_states()
        for i in range(iters):
            self._forward_backward(i % max(1, self.cfg.derived.max_steps))
            self._zero_grads()
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng)
        get_cuda_rng_tracker().set_states(tracker)

    # -- one step -------------------------------------------------------------------------------
    def _zero_grads(self):
        for m in self.model:
            m.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _forward_backward(self, step_index: int) -> torch.Tensor:
        from .batches import train_microbatches
        from .step import run_schedule
        cfg = self.cfg
        mbs = train_microbatches(self.train_ds, step=step_index, gbs=cfg.derived.gbs,
                                 minibs=cfg.batch.minibs, mbs=cfg.batch.micro_batch_size,
                                 dp_rank=self.info.dp_rank)
        return run_schedule(self.model, mbs, seq_length=cfg.model.seq_length,
                            mbs=cfg.batch.micro_batch_size, forward_only=False, cp=cfg.parallel.cp)

    def train_step(self) -> StepStats:
        from .step import global_sum
        t0 = time.perf_counter()
        k = self.state.step
        self._zero_grads()
        local = self._forward_backward(k)
        lr = self.schedule.apply(self.optimizer, k)
        _ok, grad_norm, _zeros = self.optimizer.step()
        # the loss sums carry every rank's stop request: all ranks stop after the same step
        total = global_sum(local, contributes=self.last_stage and self.info.tp_rank == 0,
                           flags=(float(self.stop.requested),))
        self.state.stop_agreed = bool(total[2] > 0)
        if torch.cuda.is_available():
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
        from .evaluation import evaluate
        from megatron.core import parallel_state as ps
        return evaluate(self.model, self.valid_ds, self.cfg, dp_rank=self.info.dp_rank,
                        dp=self.info.dp_size, last_stage=self.last_stage,
                        tp_rank=ps.get_tensor_model_parallel_rank())

    # -- the run --------------------------------------------------------------------------------
    def request_stop(self, reason: str, *, error: bool = False) -> None:
        """Stop every rank at the next step boundary (any thread). error: the run can no longer
        succeed (e.g. its MLPerf log cannot be written)."""
        self.stop.request(reason, error=error)

    def _on_signal(self, reason: str):
        # the signal watchdog thread: run_stop aborted now (unless the target was reached),
        # then the loop stops with the other ranks at the next step
        self.stop.signal(reason, lambda r: self.hooks.on_signal(self, r))

    def execute(self) -> str:
        watch = SignalWatch(on_signal=self._on_signal, grace_s=self.signal_grace_s).install()
        status, reason = "aborted", ""
        try:
            self.hooks.on_init_start(self)
            self._init()
            self._stop_if_requested(agreed=False)
            self.hooks.on_init_stop(self)
            self.state.init_stopped = True
            self.hooks.on_run_start(self)
            self.state.run_started = True
            status, reason = self._train()
        except RunAborted as e:
            reason = str(e)
        except Exception as e:  # noqa: BLE001 - any failure must end in run_stop aborted
            reason = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        finally:
            gc.enable()
            watch.done.set()
            self.state.status, self.state.reason = status, reason
            self.hooks.on_run_stop(self, status, reason)
            watch.uninstall()
        return status

    def _stop_if_requested(self, *, agreed: bool = True):
        """agreed: the stop every rank learnt from the last step's all-reduce; else this rank's
        own request (init, where no step agrees on it)."""
        if self.state.stop_agreed if agreed else self.stop.requested:
            raise RunAborted(self.stop.reason or "stopped with the other ranks: another rank "
                                                 "received a signal or could not write its log")

    def _test_delay(self, seconds: float):
        """TEST ONLY (config [testing]): slow a step or an evaluation down on purpose."""
        if seconds > 0:
            time.sleep(seconds)

    def _train(self) -> tuple[str, str]:
        d = self.cfg.derived
        perf = self.cfg.performance
        testing = self.cfg.testing
        if (testing.step_delay_s or testing.eval_delay_s) and self.info.is_rank0:
            print(f"[train] TEST ONLY: testing.step_delay_s {testing.step_delay_s} s, "
                  f"testing.eval_delay_s {testing.eval_delay_s} s slow this run down",
                  file=sys.stderr, flush=True)
        if perf.manual_gc:   # no GC pauses at random steps (stragglers stall every rank)
            gc.disable()
            gc.collect()
        block_start_step = 0
        self.hooks.on_block_start(self, 0, self._block_len(0))
        while self.state.step < d.max_steps:
            self._test_delay(testing.step_delay_s)
            stats = self.train_step()
            self.hooks.on_step_end(self, stats)
            self._stop_if_requested()
            step = self.state.step
            if perf.manual_gc and step % perf.manual_gc_interval == 0:
                gc.collect()
            if self.is_eval_step(step):
                self.hooks.on_block_stop(self, step, (step - block_start_step) * d.gbs)
                self.hooks.on_eval_start(self, step)
                t0 = time.perf_counter()
                self._test_delay(testing.eval_delay_s)
                value = self.evaluate()
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
