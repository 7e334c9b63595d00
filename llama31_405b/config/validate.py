"""Every cross-field rule of a config, in one function. Errors say what is wrong and what to do.

Pipeline split rule: the transformer layers, plus one slot for the embedding and one for the
loss when `performance.account_for_{embedding,loss}_in_pipeline_split` is set, are divided evenly
over PP x VP virtual stages (405B: 126 + 2 = 128 slots over 8 x 8 = 64 chunks, 2 each; the first
chunk holds the embedding and one layer, the last one layer and the loss).
"""
from __future__ import annotations

from ..systems import load_system
from .load import ConfigError
from .rules import lr_passes_checker, rules_for
from .schema import Config

_RULE_FIELDS_OPT = ("lr", "end_lr", "warmup_steps", "decay_steps", "weight_decay", "adam_beta1",
                    "adam_beta2", "adam_eps", "clip_grad")
_RULE_FIELDS_EVAL = ("interval_steps", "first_step", "samples", "target")


def problems(cfg: Config) -> list[str]:
    """All rule violations of a loaded config (empty when valid)."""
    out: list[str] = []
    err = out.append
    m, p, b, pr, perf = cfg.model, cfg.parallel, cfg.batch, cfg.precision, cfg.performance
    try:
        system = load_system(cfg.system.id)
    except ValueError as e:
        return [f"system.id: {e}"]
    try:
        rules = rules_for(cfg.run.benchmark)
    except ValueError as e:
        return [f"run.benchmark: {e}"]

    for name in ("tp", "pp", "vp", "cp"):
        if getattr(p, name) < 1:
            err(f"parallel.{name} must be >= 1")
    if b.minibs < 1 or b.micro_batch_size < 1 or cfg.system.racks < 1:
        err("batch.minibs, batch.micro_batch_size and system.racks must be >= 1")
    if out:
        return out
    order = p.order.split("-")
    if sorted(order) != sorted(["tp", "cp", "ep", "pp", "dp"]) or order[-1] != "dp":
        err(f"parallel.order {p.order!r}: must be a permutation of tp-cp-ep-pp-dp with dp last "
            "(DP outermost keeps each model-parallel group on consecutive ranks inside a rack)")

    # --- placement: a model-parallel group lives inside one rack -------------------------------
    per_rack = cfg.system.gpus_per_rack or system.gpus_used_per_rack
    if per_rack > system.gpus_per_nvlink_domain:
        err(f"system.gpus_per_rack {per_rack} exceeds the {system.gpus_per_nvlink_domain} GPUs "
            f"of one {system.name} NVLink domain")
    mp = p.tp * p.pp * p.cp
    if per_rack % mp:
        err(f"TP*PP*CP = {p.tp}*{p.pp}*{p.cp} = {mp} does not divide the {per_rack} GPUs used per "
            f"rack: a model-parallel group would span racks. Choose TP*PP*CP in "
            f"{[d for d in range(1, per_rack + 1) if per_rack % d == 0]}")
    elif (per_rack * cfg.system.racks) % system.gpus_per_node:
        err(f"{cfg.system.racks} racks x {per_rack} GPUs is not a whole number of "
            f"{system.gpus_per_node}-GPU nodes")

    # --- model shape vs layout -----------------------------------------------------------------
    if m.num_attention_heads % p.tp:
        err(f"model.num_attention_heads {m.num_attention_heads} not divisible by parallel.tp {p.tp}")
    if m.num_query_groups % p.tp:
        err(f"model.num_query_groups {m.num_query_groups} not divisible by parallel.tp {p.tp}")
    if m.num_attention_heads % m.num_query_groups:
        err("model.num_attention_heads must be a multiple of model.num_query_groups")
    if m.seq_length % (2 * p.cp):
        err(f"model.seq_length {m.seq_length} not divisible by 2*CP = {2 * p.cp} "
            "(context parallelism splits each sequence into 2*CP load-balanced chunks)")
    if p.sequence_parallel and (m.seq_length // p.cp) % p.tp:
        err(f"sequence parallel: seq_length/CP = {m.seq_length // p.cp} not divisible by TP {p.tp}")
    slots = (m.num_layers + perf.account_for_embedding_in_pipeline_split
             + perf.account_for_loss_in_pipeline_split)
    if slots % (p.pp * p.vp):
        err(f"pipeline split: {m.num_layers} layers"
            f"{' + embedding' if perf.account_for_embedding_in_pipeline_split else ''}"
            f"{' + loss' if perf.account_for_loss_in_pipeline_split else ''} = {slots} slots do not "
            f"divide evenly over PP*VP = {p.pp}*{p.vp} = {p.pp * p.vp} virtual stages")
    if p.vp > 1 and p.pp == 1:
        err("parallel.vp > 1 needs parallel.pp > 1 (interleaving splits pipeline stages)")
    if m.kv_channels * m.num_attention_heads != m.hidden_size:
        err("model: num_attention_heads * kv_channels must equal hidden_size for Llama 3.1")

    # --- batch ---------------------------------------------------------------------------------
    if b.minibs % b.micro_batch_size:
        err(f"batch.minibs {b.minibs} is not a multiple of batch.micro_batch_size {b.micro_batch_size}")
    else:
        micro = b.minibs // b.micro_batch_size
        if p.pp > 1 and (micro < p.pp or micro % p.pp):
            err(f"batch: MiniBS/MBS = {b.minibs}/{b.micro_batch_size} = {micro} microbatches must be "
                f">= PP ({p.pp}) and a multiple of it (interleaved 1F1B schedule)")
    if out:
        return out
    dp = cfg.system.racks * (per_rack // mp)
    gbs = b.minibs * dp
    if m.seq_length != rules.seq_length and cfg.run.division == "closed":
        err(f"model.seq_length {m.seq_length}: the closed {rules.name} rules fix it at {rules.seq_length}")
    if gbs > rules.max_gbs:
        err(f"GBS {gbs} (minibs {b.minibs} x DP {dp}) exceeds {rules.max_gbs}, the largest batch "
            f"with a reference convergence point for {rules.name}: lower batch.minibs")
    if cfg.run.division == "closed" and cfg.optimizer.lr is None and not lr_passes_checker(rules, gbs):
        err(f"GBS {gbs}: no float64 learning rate satisfies the checker's exact test "
            f"lr*{rules.ref_gbs} == {gbs}*{rules.base_lr}; pick another batch.minibs")

    # --- division ------------------------------------------------------------------------------
    if cfg.run.division == "closed":
        set_opt = [f"optimizer.{k}" for k in _RULE_FIELDS_OPT if getattr(cfg.optimizer, k) is not None]
        set_eval = [f"eval.{k}" for k in _RULE_FIELDS_EVAL if getattr(cfg.eval, k) is not None]
        if set_opt or set_eval:
            err(f"{', '.join(set_opt + set_eval)}: the closed division derives these from GBS by "
                f"the {rules.name} rules; remove them or set run.division = \"open\"")

    # --- precision and GPU settings --------------------------------------------------------------
    if pr.compute == "nvfp4" and system.nvfp4 == "none":
        err(f"precision.compute = nvfp4 needs a Blackwell GPU: {system.name} has no NVFP4 "
            "(use fp8 or bf16)")
    if pr.compute == "fp8" and system.peak_tflops_fp8 == 0 and system.nvfp4 != "emulated":
        err(f"precision.compute = fp8 is not supported on {system.name}")
    if pr.compute in ("fp32", "bf16") and (pr.bf16_layers_at_start or pr.bf16_layers_at_end):
        err("precision.bf16_layers_at_start/end only apply to fp8 or nvfp4 compute")
    if pr.bf16_layers_at_start + pr.bf16_layers_at_end > m.num_layers:
        err("precision: more BF16 edge layers than model layers")
    if pr.compute != "nvfp4" and (pr.nvfp4_rht or pr.nvfp4_stochastic_rounding or pr.nvfp4_2d_weights):
        err("precision.nvfp4_* knobs need precision.compute = nvfp4")
    if pr.nvfp4_tp_amax != "te" and (pr.compute != "nvfp4" or system.nvfp4 != "emulated"):
        err("precision.nvfp4_tp_amax = \"tensor\" is an NVFP4-emulation option (compute = nvfp4 "
            f"on an emulated system); {system.name} needs \"te\"")
    if perf.fp4_param_gather and pr.compute != "nvfp4":
        err("performance.fp4_param_gather needs precision.compute = nvfp4")
    if perf.fp8_param_gather and pr.compute != "fp8":
        err("performance.fp8_param_gather needs precision.compute = fp8 (Megatron's fp8_param); "
            "with nvfp4 compute use performance.fp4_param_gather")
    if perf.fp8_param_gather and perf.fp4_param_gather:
        err("performance: choose one of fp8_param_gather and fp4_param_gather")
    if perf.tp_comm_overlap and pr.compute == "nvfp4":
        err("performance.tp_comm_overlap with precision.compute = nvfp4: Transformer Engine "
            "userbuffers cannot all-gather NVFP4 tensors; set tp_comm_overlap = false")
    if perf.cuda_graphs == "full_iteration":
        err("performance.cuda_graphs = \"full_iteration\": the training loop captures per-layer "
            "graphs only (Megatron TECudaGraphHelper); use \"layers\" or \"none\"")
    if perf.overlap_param_gather and not cfg.optimizer.distributed:
        err("performance.overlap_param_gather needs optimizer.distributed = true")
    if perf.overlap_param_gather and not perf.overlap_grad_reduce:
        err("performance.overlap_param_gather needs performance.overlap_grad_reduce = true "
            "(Megatron's rule: the parameter gather is overlapped through the gradient buckets)")
    if (perf.fp8_param_gather or perf.fp4_param_gather) and not cfg.optimizer.distributed:
        err("performance.fp8/fp4_param_gather needs optimizer.distributed = true (only "
            "Megatron's distributed optimizer writes its FP32 master shards back into quantized "
            "parameters)")
    if system.id == "cpu":
        gpu_only = [k for k, on in (("performance.cuda_graphs", perf.cuda_graphs != "none"),
                                    ("performance.tp_comm_overlap", perf.tp_comm_overlap),
                                    ("performance.fp8_param_gather", perf.fp8_param_gather),
                                    ("performance.fp4_param_gather", perf.fp4_param_gather)) if on]
        if gpu_only:
            err(f"{', '.join(gpu_only)}: GPU-only settings on system 'cpu'")
        if p.cp > 1:
            err("parallel.cp > 1 needs Transformer Engine attention (GPU); use cp = 1 on CPU")
        if p.sequence_parallel:
            err("parallel.sequence_parallel needs Transformer Engine norms (GPU); disable it on CPU")
        if pr.compute == "fp8":
            err("precision.compute = fp8 needs Transformer Engine (GPU); use fp32, bf16 or nvfp4 on CPU")
    elif p.tp > 1 and not p.sequence_parallel:
        err("parallel.sequence_parallel should be on with TP > 1 on GPU (activation memory)")
    if perf.manual_gc and perf.manual_gc_interval < 1:
        err("performance.manual_gc_interval must be >= 1")
    if cfg.run.num_runs < 1:
        err("run.num_runs must be >= 1")
    if cfg.checkpoint.init_step != 0 and cfg.run.division == "closed":
        err("checkpoint.init_step must be 0 (MLPerf: init_checkpoint_step 0)")
    bad_env = [k for k in cfg.env if not k.replace("_", "").isalnum() or k[0].isdigit()]
    if bad_env:
        err(f"env: invalid variable name(s) {bad_env}")
    return out


def validate(cfg: Config) -> None:
    """Raise ConfigError listing every problem, prefixed by the config file."""
    found = problems(cfg)
    if found:
        raise ConfigError(f"{cfg.source or '<config>'}: invalid config:\n  - " + "\n  - ".join(found))
