"""Every cross-field rule of a config, as small rule functions by concern. Each returns its
messages (empty when the config satisfies it); a message says what is wrong and what to do.

`problems(cfg)` runs them in order: the basics (known system and benchmark, positive sizes), then
the layout and batch shape, and only on a sound layout the rules that read the derived values
(`cfg.derived`: DP, GBS, rule-derived steps), the run and data bound, and the precision, GPU and
CUDA-graph rules of `config.validate_gpu`, which carry the Transformer Engine and megatron-core
constraints (each stated there once).

Pipeline split rule: the transformer layers, plus one slot for the embedding and one for the
loss when `performance.account_for_{embedding,loss}_in_pipeline_split` is set, are divided evenly
over PP x VP virtual stages (405B: 126 + 2 = 128 slots over 8 x 8 = 64 chunks, 2 each; the first
chunk holds the embedding and one layer, the last one layer and the loss).
"""
from __future__ import annotations

import math
from collections.abc import Callable

from ..systems import load_system
from .derived import Derived
from .errors import ConfigError
from .rcp import MAX_STEPS_ROUNDING, RCP_MULTIPLE, max_steps_for, rcp_mean
from .rules import hparams, lr_passes_checker, rules_for
from .schema import Config
from .validate_gpu import cuda_graph_rules, gpu_setting_rules, precision_rules

Rule = Callable[[Config, Derived], list[str]]

_RULE_FIELDS_OPT = ("lr", "end_lr", "warmup_steps", "decay_steps", "weight_decay", "adam_beta1",
                    "adam_beta2", "adam_eps", "clip_grad")
_RULE_FIELDS_EVAL = ("interval_steps", "first_step", "samples", "target")
_MODEL_SIZES = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                "num_query_groups", "kv_channels", "vocab_size", "make_vocab_size_divisible_by",
                "seq_length")


def basic_rules(cfg: Config) -> list[str]:
    """What every other rule (and `cfg.derived`) relies on: a known system and benchmark,
    positive sizes."""
    out = []
    try:
        load_system(cfg.system.id)
    except ValueError as e:
        out.append(f"system.id: {e}")
    try:
        rules_for(cfg.run.benchmark)
    except ValueError as e:
        out.append(f"run.benchmark: {e}")
    p, b = cfg.parallel, cfg.batch
    out += [f"parallel.{n} must be >= 1" for n in ("tp", "pp", "vp", "cp") if getattr(p, n) < 1]
    out += [f"model.{n} must be >= 1" for n in _MODEL_SIZES if getattr(cfg.model, n) < 1]
    if b.minibs < 1 or b.micro_batch_size < 1 or cfg.system.racks < 1:
        out.append("batch.minibs, batch.micro_batch_size and system.racks must be >= 1")
    if cfg.system.gpus_per_rack is not None and cfg.system.gpus_per_rack < 1:
        out.append("system.gpus_per_rack must be >= 1")
    m = cfg.data.manifest
    if not m.strip() or m.endswith(("/", ".")) or not m.endswith(".json"):
        out.append(f"data.manifest = {m!r}: the manifest's file name, ending in .json (relative to "
                   "data_dir unless absolute), e.g. \"manifest.json\"")
    return out


def placement_rules(cfg: Config, d: Derived) -> list[str]:
    """Where the NVLink domain spans nodes (NVL72) a model-parallel group lives inside one rack;
    on 8-GPU systems (the domain is the node) TP stays inside a node, CP too when TP x CP fits
    it, PP spans nodes. DP is the outermost rank dimension."""
    out, p, system = [], cfg.parallel, d.system
    order = p.order.split("-")
    if sorted(order) != sorted(["tp", "cp", "ep", "pp", "dp"]) or order[-1] != "dp":
        out.append(f"parallel.order {p.order!r}: must be a permutation of tp-cp-ep-pp-dp with dp "
                   "last (DP outermost keeps each model-parallel group on consecutive ranks inside "
                   "a rack)")
    per_rack, mp = d.gpus_per_rack, d.model_parallel_size
    if per_rack > system.gpus_per_nvlink_domain:
        out.append(f"system.gpus_per_rack {per_rack} exceeds the {system.gpus_per_nvlink_domain} "
                   f"GPUs of one {system.name} NVLink domain")
    if system.node_nvlink_domain:
        return out + node_domain_rules(cfg, d)
    if per_rack % mp:
        out.append(f"TP*PP*CP = {p.tp}*{p.pp}*{p.cp} = {mp} does not divide the {per_rack} GPUs "
                   f"used per rack: a model-parallel group would span racks. Choose TP*PP*CP in "
                   f"{[k for k in range(1, per_rack + 1) if per_rack % k == 0]}")
    elif (per_rack * cfg.system.racks) % system.gpus_per_node:
        out.append(f"{cfg.system.racks} racks x {per_rack} GPUs is not a whole number of "
                   f"{system.gpus_per_node}-GPU nodes")
    return out


def node_domain_rules(cfg: Config, d: Derived) -> list[str]:
    """8-GPU systems, whose NVLink domain is the node: TP inside one node; CP inside it when
    TP x CP fits the node, otherwise whole nodes per CP rank group; a model replica either fits
    the node or takes whole nodes (PP across nodes); the job fills whole nodes."""
    out, p, node = [], cfg.parallel, d.gpus_per_rack
    mp, name = d.model_parallel_size, d.system.name
    fits = [k for k in range(1, node + 1) if node % k == 0]
    if node != d.system.gpus_per_node:
        return [f"system.gpus_per_rack {node}: on {name} a rack (NVLink domain) is one node of "
                f"{d.system.gpus_per_node} GPUs; remove the key"]
    if cfg.system.rack_of_host:
        out.append(f"system.rack_of_host: on {name} the NVLink domain is the node itself (the "
                   "placement check takes leaf switches from Slurm's topology); remove the table")
    if node % p.tp:
        out.append(f"parallel.tp {p.tp}: a TP group must lie inside one {node}-GPU {name} node "
                   f"(NVLink); choose TP in {fits}")
        return out
    tc = p.tp * p.cp
    if tc > node and tc % node:
        out.append(f"TP*CP = {p.tp}*{p.cp} = {tc}: CP either stays inside a {node}-GPU node "
                   f"(TP*CP in {fits}) or spans whole nodes (TP*CP a multiple of {node})")
    elif mp > node and mp % node:
        out.append(f"TP*PP*CP = {p.tp}*{p.pp}*{p.cp} = {mp}: a model replica either fits one "
                   f"{node}-GPU node (in {fits}) or spans whole nodes (a multiple of {node})")
    elif (cfg.system.racks * node) % mp:
        out.append(f"{cfg.system.racks} nodes x {node} GPUs = {cfg.system.racks * node} GPUs do "
                   f"not hold whole model replicas of TP*PP*CP = {mp}: use a multiple of "
                   f"{math.ceil(mp / node)} nodes")
    return out


def model_layout_rules(cfg: Config, d: Derived) -> list[str]:
    """The model shape divides over TP, CP and the pipeline stages."""
    out, m, p, perf = [], cfg.model, cfg.parallel, cfg.performance
    if m.num_attention_heads % p.tp:
        out.append(f"model.num_attention_heads {m.num_attention_heads} not divisible by "
                   f"parallel.tp {p.tp}")
    if m.num_query_groups % p.tp:
        out.append(f"model.num_query_groups {m.num_query_groups} not divisible by parallel.tp {p.tp}")
    if m.num_attention_heads % m.num_query_groups:
        out.append("model.num_attention_heads must be a multiple of model.num_query_groups")
    if m.kv_channels * m.num_attention_heads != m.hidden_size:
        out.append("model: num_attention_heads * kv_channels must equal hidden_size for Llama 3.1")
    if m.seq_length % (2 * p.cp):
        out.append(f"model.seq_length {m.seq_length} not divisible by 2*CP = {2 * p.cp} (context "
                   "parallelism splits each sequence into 2*CP load-balanced chunks)")
    if p.sequence_parallel and (m.seq_length // p.cp) % p.tp:
        out.append(f"sequence parallel: seq_length/CP = {m.seq_length // p.cp} not divisible by "
                   f"TP {p.tp}")
    emb, loss = perf.account_for_embedding_in_pipeline_split, perf.account_for_loss_in_pipeline_split
    slots = m.num_layers + emb + loss
    if slots % (p.pp * p.vp):
        out.append(f"pipeline split: {m.num_layers} layers{' + embedding' if emb else ''}"
                   f"{' + loss' if loss else ''} = {slots} slots do not divide evenly over "
                   f"PP*VP = {p.pp}*{p.vp} = {p.pp * p.vp} virtual stages")
    if p.vp > 1 and p.pp == 1:
        out.append("parallel.vp > 1 needs parallel.pp > 1 (interleaving splits pipeline stages)")
    return out


def batch_rules(cfg: Config, d: Derived) -> list[str]:
    """MiniBS splits into whole microbatches that fill the pipeline schedule."""
    b, pp = cfg.batch, cfg.parallel.pp
    if b.minibs % b.micro_batch_size:
        return [f"batch.minibs {b.minibs} is not a multiple of batch.micro_batch_size "
                f"{b.micro_batch_size}"]
    micro = d.num_microbatches
    if pp > 1 and (micro < pp or micro % pp):
        return [f"batch: MiniBS/MBS = {b.minibs}/{b.micro_batch_size} = {micro} microbatches must "
                f"be >= PP ({pp}) and a multiple of it (interleaved 1F1B schedule)"]
    return []


def gbs_rules(cfg: Config, d: Derived) -> list[str]:
    """The global batch size has a reference convergence point and a checker-exact LR."""
    out, rules, gbs = [], d.rules, d.gbs
    closed = cfg.run.division == "closed"
    if closed and cfg.model.seq_length != rules.seq_length:
        out.append(f"model.seq_length {cfg.model.seq_length}: the closed {rules.name} rules fix "
                   f"it at {rules.seq_length}")
    if gbs > rules.max_gbs:
        out.append(f"GBS {gbs} (minibs {cfg.batch.minibs} x DP {d.dp}) exceeds {rules.max_gbs}, "
                   f"the largest batch with a reference convergence point for {rules.name}: lower "
                   "batch.minibs")
    if closed and cfg.optimizer.lr is None and not lr_passes_checker(rules, gbs):
        out.append(f"GBS {gbs}: no float64 learning rate satisfies the checker's exact test "
                   f"lr*{rules.ref_gbs} == {gbs}*{rules.base_lr}; pick another batch.minibs")
    return out


_FROM_GBS = {"optimizer.lr": "lr", "optimizer.warmup_steps": "warmup_steps",
             "optimizer.decay_steps": "decay_steps", "eval.interval_steps": "eval_interval_steps",
             "eval.first_step": "first_eval_step"}
"""Rule-derived keys that the rules compute from the global batch size (config/rules.py
`hparams`); the other rule fields are constants of the benchmark."""


def division_rules(cfg: Config, d: Derived) -> list[str]:
    """The closed division takes every rule-derived value from the rules: one message per key the
    config sets, naming the file that sets it and the value the rules give."""
    if cfg.run.division != "closed":
        return []
    out = []
    hp = hparams(d.rules, d.gbs)
    keys = ([f"optimizer.{k}" for k in _RULE_FIELDS_OPT if getattr(cfg.optimizer, k) is not None]
            + [f"eval.{k}" for k in _RULE_FIELDS_EVAL if getattr(cfg.eval, k) is not None])
    for key in keys:
        name = key.split(".")[1]
        field = _FROM_GBS.get(key) or {"eval.samples": "eval_samples",
                                        "eval.target": "target"}.get(key, name)
        value = getattr(hp, field)
        how = (f"derived from the global batch size ({value!r} at GBS {d.gbs})" if key in _FROM_GBS
               else f"fixed at {value!r}")
        where = cfg.set_in(key)
        out.append(f"{key} is set {'by --set' if where == '--set' else 'in ' + where}, but in the closed division it is {how} "
                   f"by the {d.rules.name} rules (config/rules.py): remove it, or set "
                   f'run.division = "open"')
    if cfg.checkpoint.init_step != 0:
        out.append("checkpoint.init_step must be 0 (MLPerf: init_checkpoint_step 0)")
    return out


def data_bound_rules(cfg: Config, d: Derived) -> list[str]:
    """Closed division: the samples requested from the dataset (max_steps x GBS; the whole LR
    schedule when run.max_steps is unset) stay within RCP_MULTIPLE x the RCP mean, and the cap
    reaches the first evaluation. The cap only ends the run: warm-up and decay stay the rules'."""
    if cfg.run.max_steps is not None and cfg.run.max_steps < 1:
        return ["run.max_steps must be >= 1 (or unset: the end of the LR schedule)"]
    if cfg.run.division != "closed":
        return []
    out, gbs = [], d.gbs
    ref = rcp_mean(d.rules.name, gbs)
    bound = RCP_MULTIPLE * ref.mean
    if d.max_steps * gbs > bound:
        what = (f"run.max_steps = {cfg.run.max_steps}" if cfg.run.max_steps is not None else
                f"run.max_steps unset (the whole LR schedule, {d.max_steps:,} steps)")
        out.append(f"{what} asks the dataset for {d.max_steps * gbs:,} samples at GBS {gbs}, more "
                   f"than {RCP_MULTIPLE} x the {ref.describe()} = {bound:,.0f}: building that "
                   f"index can outlast the 30-minute init limit. Set run.max_steps = "
                   f"{max_steps_for(d.rules.name, gbs)} (the shipped configs' rule: the largest "
                   f"multiple of {MAX_STEPS_ROUNDING} steps within the bound)")
    if d.max_steps < d.first_eval_step:
        out.append(f"run.max_steps = {d.max_steps} ends the run before its first evaluation "
                   f"(step {d.first_eval_step} at GBS {gbs}): it could never reach the target")
    return out


def run_rules(cfg: Config, d: Derived) -> list[str]:
    out = []
    if cfg.run.num_runs < 1:
        out.append("run.num_runs must be >= 1")
    if not cfg.run.collective_timeout_s > 0:
        out.append(f"run.collective_timeout_s = {cfg.run.collective_timeout_s:g}: must be > 0 "
                   "(seconds a collective waits for its peers)")
    bad_env = [k for k in cfg.env if not k.replace("_", "").isalnum() or k[0].isdigit()]
    if bad_env:
        out.append(f"env: invalid variable name(s) {bad_env}")
    t = cfg.testing
    if t.step_delay_s < 0 or t.eval_delay_s < 0:
        out.append("testing.step_delay_s / eval_delay_s must be >= 0")
    elif (t.step_delay_s or t.eval_delay_s or t.step_delay_ranks) and d.system.is_gpu:
        out.append(f"[testing] step_delay_s / eval_delay_s / step_delay_ranks slow a run down on "
                   f"purpose for the CPU fault and profile tests; remove them from a "
                   f"{d.system.name} config")
    elif t.step_delay_ranks:
        bad = [r for r in t.step_delay_ranks if not 0 <= r < d.world_size]
        if bad:
            out.append(f"testing.step_delay_ranks {bad}: not ranks of this config's world "
                       f"(0..{d.world_size - 1})")
        if not t.step_delay_s:
            out.append("testing.step_delay_ranks is set but testing.step_delay_s is 0: set the "
                       "delay the ranks should sleep before each step")
    return out


SHAPE_RULES: tuple[Rule, ...] = (placement_rules, model_layout_rules, batch_rules)
"""Rules of the layout and batch shape; the later rules assume they hold."""
RULES: tuple[Rule, ...] = (gbs_rules, division_rules, data_bound_rules, run_rules, precision_rules,
                           gpu_setting_rules, cuda_graph_rules)


def problems(cfg: Config) -> list[str]:
    """All rule violations of a config (empty when valid)."""
    out = basic_rules(cfg)
    if out:
        return out
    d = cfg.derived
    for rule in SHAPE_RULES:
        out += rule(cfg, d)
    if out:
        return out
    for rule in RULES:
        out += rule(cfg, d)
    return out


def validate(cfg: Config) -> None:
    """Raise ConfigError listing every problem, prefixed by the config file."""
    found = problems(cfg)
    if found:
        raise ConfigError(f"{cfg.source or '<config>'}: invalid config:\n  - " + "\n  - ".join(found))
