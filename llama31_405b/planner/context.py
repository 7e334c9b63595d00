"""The numbers of one layout that every part of the model reads, resolved once from a Config."""
from __future__ import annotations

from dataclasses import astuple, dataclass

from ..config.derived import padded_vocab
from ..config.schema import Config, ModelConfig
from ..systems import SystemSpec, load_system


@dataclass(frozen=True, slots=True)
class Stage:
    """One kind of pipeline rank: its transformer layers and whether it holds embedding/logits."""
    name: str
    layers: int
    embedding: bool
    logits: bool


@dataclass(frozen=True, slots=True)
class Context:
    cfg: Config
    system: SystemSpec
    model: ModelConfig
    tp: int
    pp: int
    vp: int
    cp: int
    dp: int
    racks: int
    """NVLink domains of the job (on 8-GPU systems: nodes)."""
    replicas_per_rack: int
    """0 when a replica spans racks (8-GPU nodes)."""
    mbs: int
    microbatches: int
    tokens: int
    """Tokens of one microbatch on one GPU after the sequence-parallel gather: MBS x s / CP."""
    vocab: int
    """Padded vocabulary (Megatron pads to a multiple of 128 x TP)."""
    precision: str
    stages: tuple[Stage, ...]
    key: tuple
    """Everything the per-microbatch costs depend on (all but the number of microbatches)."""

    @classmethod
    def of(cls, cfg: Config) -> "Context":
        system = load_system(cfg.system.id)
        p, m, b = cfg.parallel, cfg.model, cfg.batch
        per_rack = cfg.system.gpus_per_rack or system.gpus_used_per_rack
        mp = p.tp * p.pp * p.cp
        # on 8-GPU nodes a replica spans racks (nodes): DP = the job's GPUs / one replica's
        return cls(cfg=cfg, system=system, model=m, tp=p.tp, pp=p.pp, vp=p.vp, cp=p.cp,
                   dp=max(1, cfg.system.racks * per_rack // mp), racks=cfg.system.racks,
                   replicas_per_rack=per_rack // mp,
                   mbs=b.micro_batch_size, microbatches=b.minibs // b.micro_batch_size,
                   tokens=b.micro_batch_size * m.seq_length // p.cp,
                   vocab=padded_vocab(m, p.tp), precision=cfg.precision.compute,
                   stages=stages(cfg), key=layout_key(cfg))

    @property
    def layer_params(self) -> int:
        m = self.model
        q = m.num_attention_heads * m.kv_channels
        kv = m.num_query_groups * m.kv_channels
        return m.hidden_size * (q + 2 * kv) + q * m.hidden_size + 3 * m.hidden_size * m.ffn_hidden_size \
            + 2 * m.hidden_size

    def stage_params(self, st: Stage) -> float:
        """Parameters one GPU of this pipeline rank holds."""
        h = self.model.hidden_size
        return (st.layers * self.layer_params + (st.embedding + st.logits) * self.vocab * h) / self.tp \
            + (h if st.logits else 0)

    @property
    def params_per_gpu(self) -> float:
        """Parameters on one GPU of the fullest pipeline rank."""
        if self.key not in _PARAMS:
            _PARAMS[self.key] = max(self.stage_params(s) for s in self.stages)
        return _PARAMS[self.key]


_PARAMS: dict[tuple, float] = {}


def layout_key(cfg: Config) -> tuple:
    c = cfg
    return (c.system.id, c.system.racks, c.system.gpus_per_rack, astuple(c.parallel),
            c.batch.micro_batch_size, astuple(c.precision), astuple(c.performance),
            astuple(c.optimizer), astuple(c.model))


def stages(cfg: Config) -> tuple[Stage, ...]:
    """Pipeline rank kinds. With the embedding/loss counted in the split, the first rank holds
    one layer fewer (+embedding), the last one fewer (+output layer and loss)."""
    L, pp = cfg.model.num_layers, cfg.parallel.pp
    perf = cfg.performance
    emb, loss = perf.account_for_embedding_in_pipeline_split, perf.account_for_loss_in_pipeline_split
    if pp == 1:
        return (Stage("all", L, True, True),)
    per = (L + emb + loss) // pp
    first = Stage("first", per - emb, True, False)
    last = Stage("last", per - loss, False, True)
    middle = L - first.layers - last.layers
    out = [first, last]
    if pp > 2:
        out.insert(1, Stage("middle", middle // (pp - 2), False, False))
    return tuple(out)
