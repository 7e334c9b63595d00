"""The typed configuration tree: one dataclass per section, a docstring under every field.

Configs are TOML files whose tables mirror these classes (`[model]`, `[parallel]`, ...). Values
that MLPerf fixes for a benchmark (learning rate, warmup, decay, evaluation cadence, ...) are not
fields here: they are derived from the global batch size by `config.rules`. The optimizer and
eval sections only carry *overrides*, which an open-division config may set and a closed one may
not. Cross-field rules live in `config.validate`; derived numbers in `config.derived`
(`Config.derived`, computed once per config object).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .derived import Derived, derive

Precision = Literal["fp32", "bf16", "fp8", "nvfp4"]


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    name: str = "llama3.1-405b"
    """Human-readable model name (logged, not interpreted)."""
    num_layers: int = 126
    """Transformer decoder layers."""
    hidden_size: int = 16384
    """Model (residual stream) width."""
    ffn_hidden_size: int = 53248
    """SwiGLU inner width (each of the gate and up projections)."""
    num_attention_heads: int = 128
    """Query heads."""
    num_query_groups: int = 8
    """Key/value heads (grouped-query attention)."""
    kv_channels: int = 128
    """Head dimension."""
    vocab_size: int = 128256
    """Rows of the embedding and output layer (Meta's checkpoint size); the tokenizer may be smaller."""
    make_vocab_size_divisible_by: int = 128
    """The model vocab is padded up to a multiple of this times TP (Megatron convention)."""
    seq_length: int = 8192
    """Training and evaluation sequence length in tokens."""
    rope_base: float = 500000.0
    """RoPE base frequency (theta)."""
    rope_scaling: bool = True
    """Apply Llama 3.1 RoPE frequency scaling."""
    rope_scaling_factor: float = 8.0
    """Llama 3.1 scaling factor."""
    rope_low_freq_factor: float = 1.0
    """Llama 3.1 low-frequency factor."""
    rope_high_freq_factor: float = 4.0
    """Llama 3.1 high-frequency factor."""
    rope_original_max_positions: int = 8192
    """Context length the base model was trained at (Llama 3.1: 8192)."""
    norm_epsilon: float = 1e-5
    """RMSNorm epsilon."""
    init_method_std: float = 0.02
    """Std of the normal initialisation (only used when no checkpoint is loaded)."""


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    tp: int = 1
    """Tensor-parallel size."""
    pp: int = 1
    """Pipeline-parallel size."""
    vp: int = 1
    """Virtual pipeline chunks per pipeline rank (1 = no interleaving)."""
    cp: int = 1
    """Context-parallel size (sequence split across ranks in attention)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism inside the TP group (needs TE norms on GPU)."""
    order: str = "tp-cp-ep-pp-dp"
    """Megatron rank order; DP must be outermost so a model-parallel group is consecutive ranks."""


@dataclass(kw_only=True, slots=True)
class BatchConfig:
    minibs: int
    """Sequences per DP rank per optimizer step (MiniBS). GBS = minibs x DP."""
    micro_batch_size: int = 1
    """Sequences per microbatch (MBS); minibs / MBS microbatches per step."""
    eval_micro_batch_size: int | None = None
    """Sequences per evaluation microbatch (default: micro_batch_size)."""


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    distributed: bool = True
    """Megatron distributed optimizer (optimizer state sharded over DP)."""
    lr: float | None = None
    """Open division only: peak LR override (closed: derived from GBS)."""
    end_lr: float | None = None
    """Open division only: final LR override."""
    warmup_steps: int | None = None
    """Open division only: linear warmup steps override."""
    decay_steps: int | None = None
    """Open division only: cosine decay steps override."""
    weight_decay: float | None = None
    """Open division only: AdamW weight decay override."""
    adam_beta1: float | None = None
    """Open division only: AdamW beta1 override."""
    adam_beta2: float | None = None
    """Open division only: AdamW beta2 override."""
    adam_eps: float | None = None
    """Open division only: AdamW epsilon override."""
    clip_grad: float | None = None
    """Open division only: gradient clipping norm override."""


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    interval_steps: int | None = None
    """Open division only: evaluation interval override (closed: ceil(eval_every_samples/GBS))."""
    first_step: int | None = None
    """Open division only: first evaluation step override."""
    samples: int | None = None
    """Open division only: validation sequences override (closed: the benchmark's eval_samples)."""
    target: float | None = None
    """Open division only: target log perplexity override."""


@dataclass(kw_only=True, slots=True)
class PrecisionConfig:
    compute: Precision = "bf16"
    """Precision of the linear layers: fp32 (CPU tests), bf16, fp8 or nvfp4."""
    params: Literal["fp32", "bf16"] = "bf16"
    """Dtype of the model parameters seen by the forward pass (master weights stay FP32)."""
    attention: Literal["bf16", "fp8", "fp32"] = "bf16"
    """Precision of the attention core (the submissions keep it in BF16)."""
    grad_reduce_in_fp32: bool = True
    """Accumulate and reduce gradients in FP32 (false: in the parameter dtype, e.g. BF16)."""
    bf16_layers_at_start: int = 0
    """Transformer layers at the start kept in BF16 when compute is fp8/nvfp4."""
    bf16_layers_at_end: int = 0
    """Transformer layers at the end kept in BF16 when compute is fp8/nvfp4."""
    nvfp4_rht: bool = False
    """NVFP4: random Hadamard transform on Wgrad inputs (TE: NVTE_NVFP4_DISABLE_RHT=0)."""
    nvfp4_stochastic_rounding: bool = False
    """NVFP4: stochastic rounding of gradients (TE: NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING=0)."""
    nvfp4_2d_weights: bool = False
    """NVFP4: 16x16 2D weight scaling blocks (TE: NVTE_NVFP4_DISABLE_2D_QUANTIZATION=0)."""
    nvfp4_tp_amax: Literal["te", "tensor"] = "te"
    """NVFP4 emulation under TP: "te" reduces the amax over the TP group only where TE does
    (sequence-parallel shards); "tensor" also for weight and K/N-sharded operands (TP-invariant)."""


@dataclass(kw_only=True, slots=True)
class PerformanceConfig:
    cuda_graphs: Literal["none", "layers", "full_iteration"] = "none"
    """CUDA graph capture (GPU only): "layers" = Transformer Engine per-layer graphs;
    "full_iteration" = one graph per forward-backward pass, training and evaluation (Megatron's
    FullCudaGraphWrapper; the optimizer step stays outside)."""
    overlap_grad_reduce: bool = False
    """Overlap the DP gradient reduce-scatter with the backward pass."""
    overlap_param_gather: bool = False
    """Overlap the DP parameter all-gather with the next forward pass (needs distributed optimizer)."""
    fp8_param_gather: bool = False
    """All-gather parameters in FP8 (compute fp8 or nvfp4)."""
    fp4_param_gather: bool = False
    """All-gather parameters in NVFP4 (compute nvfp4)."""
    tp_comm_overlap: bool = False
    """Overlap TP communication with GEMMs (TE userbuffers, GPU only)."""
    account_for_embedding_in_pipeline_split: bool = False
    """Count the embedding as one layer when splitting layers over pipeline stages."""
    account_for_loss_in_pipeline_split: bool = False
    """Count the output layer + loss as one layer when splitting layers over pipeline stages."""
    recompute: Literal["none", "selective", "full"] = "none"
    """Activation recomputation granularity."""
    ddp_bucket_size: int | None = None
    """Gradient bucket size in elements (None: Megatron's default, max(40 M, 1 M x DP))."""
    cuda_device_max_connections: int | None = None
    """CUDA_DEVICE_MAX_CONNECTIONS for the launcher (1 keeps comm/compute order with TP overlap)."""
    nccl_nvls_enable: bool | None = None
    """NCCL_NVLS_ENABLE (NVLink SHARP) for the launcher; None leaves NCCL's default."""
    nccl_min_ctas: int | None = None
    """NCCL_MIN_CTAS for the launcher; None leaves NCCL's default."""
    nccl_max_ctas: int | None = None
    """NCCL_MAX_CTAS for the launcher; None leaves NCCL's default."""
    expandable_segments: bool = False
    """PyTorch's CUDA caching allocator grows expandable segments instead of fixed blocks
    (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, GPU only); with CUDA graphs the launcher
    then turns NCCL's buffer registration off (config.env)."""
    nccl_communicator_config: str | None = None
    """YAML of per-communicator NCCL options (min/max CTAs, CGA cluster size) for Megatron's
    initialize_model_parallel(nccl_communicator_config_path=...); a relative path is resolved
    against the repository's configs/ directory (e.g. "nccl/gb200_communicators.yaml")."""
    manual_gc: bool = False
    """Disable automatic Python GC and collect every manual_gc_interval steps."""
    manual_gc_interval: int = 100
    """Steps between manual garbage collections."""
    gradient_accumulation_fusion: bool = False
    """Accumulate weight gradients into the main-grad buffer inside the wgrad GEMM (Megatron's
    gradient_accumulation_fusion; GPU only, needs Apex's fused_weight_gradient_mlp_cuda)."""

    def dp_overlap(self) -> dict:
        """How the DP collectives meet the compute, as a profile's manifest records it:
        megatron-core's two overlaps and the DDP bucket size (None: megatron-core's default).
        Two layouts alike but for these are two calibration inputs (`plan --calibrate` matches
        its folders by them too)."""
        return dict(grad_reduce=self.overlap_grad_reduce, param_gather=self.overlap_param_gather,
                    bucket=self.ddp_bucket_size)


@dataclass(kw_only=True, slots=True)
class DataConfig:
    data_dir: str = "/data"
    """Root for the paths below (the launcher's DATADIR overrides it)."""
    tokenizer: str = "tokenizer/tokenizer.model"
    """Sentencepiece model, relative to data_dir."""
    train_prefixes: list[str] = field(default_factory=lambda: [
        "c4-train.en_6_text_document", "c4-train.en_7_text_document"])
    """Megatron indexed-dataset prefixes (.bin/.idx) for training, relative to data_dir."""
    train_weights: list[float] = field(default_factory=lambda: [0.5, 0.5])
    """Blend weights of train_prefixes."""
    valid_prefix: str = "c4-validation-91205-samples.en_text_document"
    """Validation indexed-dataset prefix, relative to data_dir."""
    pretrain_prefix: str | None = None
    """Tiny benchmark only: prefix of the separate shard the initial checkpoint is pre-trained on."""
    index_cache_dir: str = "index_cache"
    """Where GPTDataset index caches go, relative to data_dir unless absolute (written by the
    first run on new data: on a read-only data_dir, an absolute writable path)."""
    manifest: str = "manifest.json"
    """The data manifest (checksums, verification records; docs/data.md), relative to data_dir
    unless absolute. `data verify` writes to it every job: on a read-only data_dir, an absolute
    writable path."""
    require_verified: bool = True
    """Refuse to train on data whose manifest does not verify."""


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    ckpt_dir: str = "/ckpt"
    """Root for checkpoints (the launcher's CKPTDIR overrides it)."""
    init: str = "llama3.1-405b-megatron"
    """Initial checkpoint (Megatron distributed format), relative to ckpt_dir."""
    init_step: int = 0
    """Step of the initial checkpoint (MLPerf: 0)."""


@dataclass(kw_only=True, slots=True)
class SystemConfig:
    id: str
    """System id naming a hardware file in llama31_405b/systems (gb200-nvl72, cpu, ...)."""
    racks: int
    """NVLink domains (racks) used by the job; on 8-GPU systems (DGX/HGX), whose NVLink domain is
    the node, the nodes."""
    gpus_per_rack: int | None = None
    """GPUs used per rack (default: the system file's gpus_used_per_rack)."""
    rack_of_host: dict[str, str] = field(default_factory=dict)
    """Explicit rack (NVLink domain) of each host, for the placement check: keys are hostnames
    or shell patterns ("gb200-r07-*"), values rack names. When set, it overrides the driver's
    fabric clique and Slurm's topology, and every host of the job must match a key."""


@dataclass(kw_only=True, slots=True)
class RunConfig:
    benchmark: str = "llama31_405b"
    """Benchmark whose rules apply: llama31_405b, or tiny_llama31 for the CPU benchmark."""
    division: Literal["closed", "open"] = "closed"
    """MLPerf division; closed configs cannot override rule-derived hyperparameters."""
    org: str = "reference"
    """submission_org logged in the MLPerf header."""
    platform: str | None = None
    """submission_platform (default: derived from system and node count)."""
    status: Literal["available", "preview", "research", "onprem", "cloud"] = "cloud"
    """submission_status."""
    seed_base: int | None = None
    """Run i uses seed seed_base + i; None (MLPerf closed division): each run's seed is drawn from
    the system's entropy (config.seeds)."""
    num_runs: int = 3
    """Runs per submission (MLPerf: 3)."""
    max_steps: int | None = None
    """Stop with status aborted after this many steps (default: the end of the LR schedule). Only
    ends the run: warm-up and decay stay the rules'. Closed division: max_steps x GBS at most twice
    the RCP mean samples-to-converge (config/rcp.py)."""
    warmup_iters: int = 0
    """Untimed warm-up iterations before run_start; weights, optimizer, RNG and data are restored."""
    log_interval: int = 1
    """Steps between progress lines."""
    collective_timeout_s: float = 600.0
    """Seconds a collective waits for its peers (the process groups' timeout): a rank that died
    or stopped answering ends the run after this long at most, the reason naming it
    (train.heartbeat). `train --timeout-s` overrides it; run_and_time.sh takes it from the
    config."""
    accept_memory_risk: bool = False
    """Launch a GPU config the planner predicts does not fit in GPU memory (experiments only):
    `config check`, `compliance precheck` and the launch pre-flight then print the risk instead
    of refusing the config."""
    cache_dir: str | None = None
    """Writable directory (inside the container) for JIT and compiler caches: Triton, TorchInductor,
    CUDA's kernel cache, torch extensions, matplotlib (config.env); None leaves every
    tool's default, which may lie in a read-only image."""


class _DerivedSlot:
    """Holds the cached `Config.derived`, and the loader's record of which file set each key, in
    slots that are not dataclass fields, so `dataclasses.asdict`, `replace`, `==` and pickling
    ignore them (a replaced config recomputes; its keys are then said to come from `source`)."""
    __slots__ = ("_derived", "_origins")
    _derived: Derived
    """`Config.derived`, computed on first use."""
    _origins: dict[str, str]
    """`Config.record_origins`: dotted key -> the file that set it."""


@dataclass(kw_only=True, slots=True)
class TestingConfig:
    """TEST ONLY: knobs of the fault tests (tests/test_slurm.py, tests/test_train_failure.py).
    Leave them at 0 in every real config: they slow the run down on purpose."""
    step_delay_s: float = 0.0
    """TEST ONLY: seconds slept before every training step, so a signal lands inside a step
    that outlasts Slurm's KillWait on any machine."""
    eval_delay_s: float = 0.0
    """TEST ONLY: seconds slept at the start of every evaluation (after eval_start is logged)."""
    step_delay_ranks: list[int] = field(default_factory=list)
    """TEST ONLY: when set, step_delay_s applies only on these global ranks (a straggler for the
    profile tests, tests/test_profile_run.py); empty: on every rank."""

    def step_delay_on(self, rank: int) -> float:
        """Seconds slept before each training step on `rank`."""
        if self.step_delay_ranks and rank not in self.step_delay_ranks:
            return 0.0
        return self.step_delay_s


@dataclass(kw_only=True, slots=True)
class Config(_DerivedSlot):
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model shape."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Parallel layout."""
    batch: BatchConfig
    """Batch sizes."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer (rule-derived values are not set here)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation overrides (open division)."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Numerics."""
    performance: PerformanceConfig = field(default_factory=PerformanceConfig)
    """GPU performance settings."""
    data: DataConfig = field(default_factory=DataConfig)
    """Data locations."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint locations."""
    system: SystemConfig
    """Hardware and scale."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run control and submission metadata."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the launcher (merged last by config.env.launch_env)."""
    testing: TestingConfig = field(default_factory=TestingConfig)
    """TEST ONLY: delays for the fault tests; leave unset."""
    source: str = field(default="", metadata={"internal": True})
    """Path of the file this config was loaded from (set by the loader, not by files)."""

    def record_origins(self, origins: dict[str, str]) -> None:
        """The loader's record: dotted key -> the file that set it ('<overrides>': --set)."""
        # the slot is _DerivedSlot's, which mypy does not see from a slots dataclass
        self._origins = dict(origins)  # type: ignore[misc]

    def set_in(self, key: str) -> str:
        """Where dotted `key` was set, for messages: the file, '--set' for an override, else
        `source`."""
        where = getattr(self, "_origins", {}).get(key) or self.source or "<config>"
        return "--set" if where == "<overrides>" else where

    @property
    def derived(self) -> Derived:
        """Numbers derived from the config and the benchmark rules (see config.derived), computed
        on first use and kept: a config is read-only once loaded (change it with
        `dataclasses.replace`, whose result computes its own)."""
        try:
            return self._derived
        except AttributeError:
            self._derived = derive(self)  # type: ignore[misc]  # _DerivedSlot's slot (above)
            return self._derived
