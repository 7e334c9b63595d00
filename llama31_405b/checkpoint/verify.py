"""Load a converted Megatron checkpoint at the config's layout, run a few sequences through it and
through the Hugging Face model, and report the largest logit difference.

Runs on every rank of a job with the config's world size (one process for TP1/PP1; torchrun or
srun otherwise). The Megatron forward uses the pipeline schedule, so any TP/PP/VP works; the
vocab-parallel logits of the last stage are gathered over TP and compared on one rank (last
stage, TP rank 0, DP rank 0), which also runs the Hugging Face model. The result is shared with
every rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config.schema import Config


@dataclass(frozen=True, slots=True)
class VerifyResult:
    max_abs_diff: float
    """Largest |logit_megatron - logit_hf| over all sequences, positions and vocab entries."""
    max_abs_logit: float
    """Largest |logit_hf| (scale for the difference)."""
    sequences: int
    seq_len: int
    argmax_agreement: float
    """Fraction of positions where both models predict the same next token."""
    chunk_tp: int = 1
    """The TP whose chunks the checkpoint stores (its record, checkpoint.chunking; 1: whole
    layers): any loads at any TP, a load at this TP reads each chunk once."""


def sample_tokens(vocab: int, sequences: int, seq_len: int, seed: int):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (sequences, seq_len), generator=g)


def megatron_logits(cfg: Config, chunks, tokens):
    """Logits [n, s, vocab_size] (unpadded, FP32) on last-stage ranks, None elsewhere."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region
    n, s = tokens.shape
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)[None, None]
    pos = torch.arange(s)[None]

    def step(data_iter, model):
        ids = next(data_iter)
        out = model(ids, pos.expand_as(ids), mask)

        def collect(output, non_loss_data=False):
            full = gather_from_tensor_model_parallel_region(output)
            return full[..., :cfg.model.vocab_size].float()
        return out, collect

    for c in chunks:
        c.eval()
    with torch.no_grad():
        outs = get_forward_backward_func()(
            forward_step_func=step, data_iterator=[iter(tokens.split(1)) for _ in chunks]
            if len(chunks) > 1 else iter(tokens.split(1)),
            model=chunks if len(chunks) > 1 else chunks[0], num_microbatches=n, seq_length=s,
            micro_batch_size=1, forward_only=True, collect_non_loss_data=True)
    if not ps.is_pipeline_last_stage(ignore_virtual=True):
        return None
    return torch.cat(list(outs), dim=0)


def hf_logits(hf_dir: str | Path, tokens, dtype: str = "float32"):
    import torch
    try:
        import transformers
        from transformers import LlamaForCausalLM
    except ImportError:
        raise RuntimeError("checkpoint verify runs the Hugging Face model and needs the "
                           "transformers package (pip install 'transformers>=4.45')") from None
    t = getattr(torch, dtype)
    # transformers 5 renamed from_pretrained's torch_dtype to dtype
    kw = {"dtype": t} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": t}
    model = LlamaForCausalLM.from_pretrained(str(hf_dir), **kw)
    model.eval()
    with torch.no_grad():
        return model(tokens).logits.float()


def compare(ours, ref) -> tuple[float, float, float]:
    diff = (ours - ref).abs().max().item()
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
    return diff, ref.abs().max().item(), agree


def verify(cfg: Config, hf_dir: str | Path, megatron_dir: str | Path, *, sequences: int = 4,
           seq_len: int = 32, seed: int = 0, hf_dtype: str = "float32", log=print) -> VerifyResult:
    """Needs the parallel setup of cfg (llama31_405b.parallel.setup.setup_parallel)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from ..model.builder import build_model
    from ..parallel.setup import seed_model_parallel
    from .format import load, stored_chunking
    seed_model_parallel(seed)   # the build initialises weights before the load
    chunks = build_model(cfg)
    info = load(chunks, megatron_dir, cfg)      # what training calls
    if cfg.parallel.vp > 1:
        # the interleaved schedule runs microbatches in groups of PP
        sequences = -(-sequences // cfg.parallel.pp) * cfg.parallel.pp
    tokens = sample_tokens(cfg.model.vocab_size, sequences, seq_len, seed)
    ours = megatron_logits(cfg, chunks, tokens)
    reporter = (ps.is_pipeline_last_stage(ignore_virtual=True)
                and ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0)
    stats = torch.zeros(3, dtype=torch.float64)
    if reporter:
        stats = torch.tensor(compare(ours, hf_logits(hf_dir, tokens, hf_dtype)),
                             dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    return VerifyResult(max_abs_diff=stats[0].item(), max_abs_logit=stats[1].item(),
                        sequences=sequences, seq_len=seq_len, argmax_agreement=stats[2].item(),
                        chunk_tp=stored_chunking(info, cfg, str(megatron_dir)).tp)


__all__ = ["VerifyResult", "megatron_logits", "hf_logits", "verify", "sample_tokens", "compare"]
