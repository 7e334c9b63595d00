"""Numbers that follow from a config: layout sizes, batch sizes, rule-derived hyperparameters, FLOPs.

Nothing here is typed by hand in a config file; `config show --json` prints all of it. Reached
as `cfg.derived` (computed once per config object); this module reads the config sections by
attribute and does not import the schema, which imports it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..systems import SystemSpec, load_system
from .rules import BenchmarkRules, HParams, hparams, rules_for


@dataclass(kw_only=True, frozen=True, slots=True)
class Derived:
    system: SystemSpec
    rules: BenchmarkRules
    gpus_per_rack: int
    model_parallel_size: int
    """TP x PP x CP: ranks holding one model replica; inside one rack where the NVLink domain
    spans nodes (NVL72), over `racks_per_replica` nodes on 8-GPU systems."""
    replicas_per_rack: int
    """Model replicas per rack (0 when one replica spans several racks: 8-GPU nodes)."""
    racks_per_replica: int
    """Racks (NVLink domains) one model replica spans: 1 on NVL72, TP x PP x CP / 8 on 8-GPU
    nodes."""
    segment_nodes: int
    """Nodes Slurm should keep together (`sbatch --segment`): one rack where the NVLink domain
    spans nodes (16 on GB200 NVL72), else the nodes of one model-parallel group."""
    dp: int
    world_size: int
    nodes: int
    gbs: int
    num_microbatches: int
    """MiniBS / MBS: microbatches per DP rank per step."""
    gradient_accumulation_steps: int
    """As logged for MLPerf: microbatches per DP rank per optimizer step."""
    layers_per_virtual_stage: float
    lr: float
    end_lr: float
    warmup_steps: int
    decay_steps: int
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    weight_decay: float
    clip_grad: float
    decay_schedule: str
    eval_interval_steps: int
    first_eval_step: int
    eval_samples: int
    target: float
    max_steps: int
    padded_vocab_size: int
    params_total: int
    model_flops_per_sequence: float
    """Training FLOPs per sequence (forward + backward), non-causal Megatron convention."""
    platform: str


def padded_vocab(model, tp: int) -> int:
    """The model vocab padded up to a multiple of make_vocab_size_divisible_by x TP (`model`: a
    ModelConfig)."""
    mult = model.make_vocab_size_divisible_by * tp
    return math.ceil(model.vocab_size / mult) * mult


def param_count(model, vocab: int | None = None) -> int:
    """Parameters of a Llama 3.1 model (untied embeddings, no biases)."""
    h, f, L = model.hidden_size, model.ffn_hidden_size, model.num_layers
    v = model.vocab_size if vocab is None else vocab
    q = model.num_attention_heads * model.kv_channels
    kv = model.num_query_groups * model.kv_channels
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * f + 2 * h
    return L * per_layer + 2 * v * h + h


def model_flops_per_sequence(model) -> float:
    """12 s L h^2 [(1 + g/n + s/h) + 1.5 f/h + V/(2 L h)]: the convention of the MLPerf
    submissions (non-causal attention, SwiGLU, GQA), 21,508 TFLOP for 405B at s = 8192."""
    s, L, h = model.seq_length, model.num_layers, model.hidden_size
    g, n, f, V = (model.num_query_groups, model.num_attention_heads, model.ffn_hidden_size,
                  model.vocab_size)
    return 12.0 * s * L * h * h * ((1 + g / n + s / h) + 1.5 * f / h + V / (2 * L * h))


def effective_hparams(cfg, rules: BenchmarkRules, gbs: int) -> HParams:
    """Rule-derived values, with the open division's overrides applied (closed: none allowed)."""
    hp = hparams(rules, gbs)
    o, e = cfg.optimizer, cfg.eval
    pick = lambda over, base: base if over is None else over  # noqa: E731
    return HParams(
        lr=pick(o.lr, hp.lr), end_lr=pick(o.end_lr, hp.end_lr),
        warmup_steps=pick(o.warmup_steps, hp.warmup_steps),
        decay_steps=pick(o.decay_steps, hp.decay_steps),
        adam_beta1=pick(o.adam_beta1, hp.adam_beta1), adam_beta2=pick(o.adam_beta2, hp.adam_beta2),
        adam_eps=pick(o.adam_eps, hp.adam_eps), weight_decay=pick(o.weight_decay, hp.weight_decay),
        clip_grad=pick(o.clip_grad, hp.clip_grad), decay_schedule=hp.decay_schedule,
        eval_interval_steps=pick(e.interval_steps, hp.eval_interval_steps),
        first_eval_step=pick(e.first_step, hp.first_eval_step),
        eval_samples=pick(e.samples, hp.eval_samples), target=pick(e.target, hp.target),
    )


def derive(cfg) -> Derived:
    """Every derived number of `cfg` (a Config); use `cfg.derived`, which keeps the result."""
    system = load_system(cfg.system.id)
    rules = rules_for(cfg.run.benchmark)
    p = cfg.parallel
    per_rack = cfg.system.gpus_per_rack or system.gpus_used_per_rack
    mp = p.tp * p.pp * p.cp
    # DP = the job's GPUs over one replica's (config.validate says when they do not divide)
    dp = max(1, cfg.system.racks * per_rack // mp)
    world = dp * mp
    nodes = math.ceil(world / system.gpus_per_node)
    segment = math.ceil(max(mp, per_rack) / system.gpus_per_node)
    gbs = cfg.batch.minibs * dp
    micro = cfg.batch.minibs // cfg.batch.micro_batch_size
    hp = effective_hparams(cfg, rules, gbs)
    slots = (cfg.model.num_layers + cfg.performance.account_for_embedding_in_pipeline_split
             + cfg.performance.account_for_loss_in_pipeline_split)
    platform = cfg.run.platform or f"{nodes}x{system.name.replace(' ', '-')}"
    return Derived(
        system=system, rules=rules, gpus_per_rack=per_rack, model_parallel_size=mp,
        replicas_per_rack=per_rack // mp, racks_per_replica=math.ceil(mp / per_rack),
        segment_nodes=min(max(1, segment), nodes), dp=dp, world_size=world, nodes=nodes, gbs=gbs,
        num_microbatches=micro, gradient_accumulation_steps=micro,
        layers_per_virtual_stage=slots / (p.pp * p.vp),
        lr=hp.lr, end_lr=hp.end_lr, warmup_steps=hp.warmup_steps, decay_steps=hp.decay_steps,
        adam_beta1=hp.adam_beta1, adam_beta2=hp.adam_beta2, adam_eps=hp.adam_eps,
        weight_decay=hp.weight_decay, clip_grad=hp.clip_grad, decay_schedule=hp.decay_schedule,
        eval_interval_steps=hp.eval_interval_steps, first_eval_step=hp.first_eval_step,
        eval_samples=hp.eval_samples, target=hp.target,
        max_steps=cfg.run.max_steps or (hp.warmup_steps + hp.decay_steps),
        padded_vocab_size=padded_vocab(cfg.model, p.tp),
        params_total=param_count(cfg.model),
        model_flops_per_sequence=model_flops_per_sequence(cfg.model),
        platform=platform,
    )
