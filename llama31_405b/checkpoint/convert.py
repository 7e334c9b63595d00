"""Hugging Face Llama 3.1 checkpoint -> Megatron distributed checkpoint (torch_dist), streamed.

Flow (details and the memory argument in docs/checkpoint.md):
1. Index the Hugging Face directory (safetensors headers only) and check it against the config:
   vocab, every shape, missing/unexpected tensors, dtypes, config.json hyperparameters; then the
   output directory and its free space. Any problem stops here, before a byte is written.
2. Build the model once at TP1/PP1 on the meta device (no memory) with the project's builder and
   take its sharded state dict: Megatron's own keys, global shapes, layer offsets, SwiGLU
   factory and `_extra_state` objects, i.e. exactly what a Megatron save of the model writes.
3. For each Megatron tensor: read its Hugging Face source(s) one at a time, fuse (QKV, fc1) into
   one buffer, put it in the template's ShardedTensor, split it into the pieces the chunking
   stores (checkpoint.chunking: whole layers at TP1, or the pieces megatron-core requests at the
   config's TP) and save each TP rank's pieces as their own part with Megatron's save; free it.
   Peak memory ~ the largest fused tensor x 1.5 (+ the interpreter and Megatron).
4. Join the parts: move the data files, write one `.metadata`. The result loads at any TP/PP/VP;
   a run at the chunking's TP reads each stored chunk once per job (docs/checkpoint.md).

Resumable: parts live in OUT/.convert_parts with a fingerprint of the inputs; a rerun skips the
finished parts (a part is finished once its marker is written, after Megatron's save returned).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import re
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..config.schema import Config
from . import mapping
from .chunking import RECORD_KEY, Chunking, ChunkingError
from .dcp_parts import METADATA, join, part_done, save_part
from .format import write_model_info
from .hf_reader import HFCheckpoint
from .progress import ByteProgress, human_bytes, human_seconds

PARTS_DIR = ".convert_parts"
FINGERPRINT = "fingerprint.json"
_LAYER = re.compile(r"(?:^|\.)decoder\.layers\.(\d+)\.")


@dataclass(frozen=True, slots=True)
class ConvertResult:
    out_dir: Path
    tensors: int
    bytes_read: int
    seconds: float
    resumed_parts: int
    dtype: str


def params_dtype(cfg: Config):
    import torch
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[cfg.precision.params]


def single_layout(cfg: Config) -> Config:
    """cfg at TP1/PP1/VP1/CP1, compute precision = parameter precision: the layout the converter
    sees the whole model in. Checkpoint keys do not depend on the layout."""
    par = dataclasses.replace(cfg.parallel, tp=1, pp=1, vp=1, cp=1, sequence_parallel=False)
    prec = dataclasses.replace(cfg.precision, compute=cfg.precision.params)
    sysc = dataclasses.replace(cfg.system, racks=1, gpus_per_rack=1)
    return dataclasses.replace(cfg, parallel=par, precision=prec, system=sysc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def single_process_megatron():
    """A one-rank gloo group and Megatron's parallel state at TP1/PP1, unless one exists."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from .. import cpu_compat
    from ..systems.device import CPU
    cpu_compat.apply(CPU)      # conversion is host work, whatever the config's system
    own_dist = not dist.is_initialized()
    if own_dist:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}",
                                rank=0, world_size=1)
    own_ps = not ps.model_parallel_is_initialized()
    if own_ps:
        if dist.get_world_size() != 1:
            raise RuntimeError("checkpoint conversion runs in a single process; launch it "
                               "without torchrun/srun")
        ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    try:
        yield
    finally:
        if own_ps:
            ps.destroy_model_parallel()
        if own_dist:
            dist.destroy_process_group()


def sharded_template(cfg: Config) -> dict:
    """The sharded state dict of the whole model (TP1/PP1) on the meta device: keys, shapes,
    offsets and factories without memory. Needs single_process_megatron()."""
    import torch

    from ..model.builder import build_model
    from ..systems.device import CPU
    one = single_layout(cfg)
    with torch.device("meta"):
        # the CPU (local) layer spec: its checkpoint keys are the Transformer Engine spec's
        # (checkpoint.mapping), and nothing of the model is computed
        (model,) = build_model(one, device=CPU)
    return model.sharded_state_dict()


def _index_template(template: dict, cfg: Config):
    """(key, layer) -> template entry for tensors; everything else goes to `objects`."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
    tensors, objects = {}, {}
    for name, entry in template.items():
        if isinstance(entry, (ShardedTensor, ShardedTensorFactory)):
            m = _LAYER.search(name)
            tensors[(entry.key, int(m.group(1)) if m else None)] = (name, entry)
        else:
            objects[name] = entry
    wanted = {(t.key, t.layer) for t in mapping.targets(cfg.model)}
    extra = sorted(f"{k}[layer {i}]" if i is not None else k for k, i in tensors.keys() - wanted)
    lacking = sorted(f"{k}[layer {i}]" if i is not None else k for k, i in wanted - tensors.keys())
    if extra or lacking:
        raise mapping.ConversionError(
            "the Megatron model built from the config does not match the Llama mapping: "
            f"model tensors without a Hugging Face source: {extra[:6] or 'none'}; mapped "
            f"tensors the model lacks: {lacking[:6] or 'none'}")
    return tensors, objects


def _filled(entry, tensor):
    """The template entry carrying `tensor`, expanded to plain ShardedTensors/Objects."""
    from megatron.core.dist_checkpointing.mapping import (ShardedTensorFactory,
                                                          apply_factories)
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    if isinstance(entry, ShardedTensorFactory):
        if tuple(tensor.shape) != tuple(entry.data.shape):
            raise mapping.ConversionError(f"{entry.key}: built {tuple(tensor.shape)}, the model "
                                          f"has {tuple(entry.data.shape)}")
        fac = dataclasses.replace(entry, data=tensor)
        built = {"x": fac}
        apply_factories(built)
        return {f"{entry.key}#{i}": v for i, v in enumerate(nested_values(built))}
    shape = tuple(tensor.shape)
    if entry.key in (mapping.EMBED, mapping.OUTPUT):
        # stored at the true vocab: Megatron zero-pads per TP on load (allow_shape_mismatch)
        return {entry.key: dataclasses.replace(
            entry, data=tensor, dtype=tensor.dtype, local_shape=shape, global_shape=shape,
            axis_fragmentations=(1,) * len(shape))}
    if shape != tuple(entry.local_shape):
        raise mapping.ConversionError(f"{entry.key}: built {shape}, the model has "
                                      f"{tuple(entry.local_shape)}")
    return {entry.key: dataclasses.replace(entry, data=tensor, dtype=tensor.dtype)}


def _fingerprint(hf: HFCheckpoint, cfg: Config, dtype, chunking: Chunking) -> dict:
    tensors = {n: [t.dtype, list(t.shape)] for n, t in sorted(hf.tensors.items())}
    model = dataclasses.asdict(cfg.model)
    # whole layers fingerprint as before the chunking existed (an unfinished TP1 conversion
    # resumes); a split one also by its chunking
    inputs = [tensors, model, str(dtype)] + ([chunking.record()] if chunking.tp > 1 else [])
    digest = hashlib.sha256(json.dumps(inputs).encode()).hexdigest()
    return {"hf_dir": str(hf.dir.resolve()), "dtype": str(dtype), "chunk_tp": chunking.tp,
            "sha256": digest}


def _check_out(out: Path, fp: dict) -> Path:
    """The parts directory to use; refuses a finished checkpoint, a non-empty directory and an
    unfinished conversion of other inputs. Writes nothing."""
    if (out / METADATA).exists():
        raise FileExistsError(f"{out} already holds a distributed checkpoint; remove it or "
                              "choose another --out")
    parts = out / PARTS_DIR
    stamp = parts / FINGERPRINT
    if stamp.exists():
        old = json.loads(stamp.read_text())
        if old.get("sha256") != fp["sha256"]:
            raise FileExistsError(
                f"{parts} holds an unfinished conversion of other inputs ({old.get('hf_dir')}, "
                f"{old.get('dtype')}, chunks for TP {old.get('chunk_tp', 1)}); delete {parts} "
                "to start over")
    elif out.exists() and any(p.name != PARTS_DIR for p in out.iterdir()):
        raise FileExistsError(f"{out} is not empty; choose an empty or new --out directory")
    return parts


def _existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def _check_disk(out: Path, pending: list, dtype) -> None:
    """Refuse to start when the output filesystem cannot hold the tensors left to write."""
    import torch
    elem = torch.finfo(dtype).bits // 8
    need = sum(math.prod(t.shape) for t in pending) * elem * 1.01 + 64 * 2**20
    free = shutil.disk_usage(out).free
    if free < need:
        raise mapping.ConversionError(
            f"{out}: {human_bytes(free)} free, the conversion needs about {human_bytes(need)} "
            f"more ({len(pending)} tensors in {str(dtype).split('.')[-1]}); free space or "
            "choose another --out")


def chunking_for(cfg: Config, chunk_tp: int | None = None) -> Chunking:
    """The chunking a conversion for cfg writes: split as megatron-core splits the tensors at
    `chunk_tp`, by default the config's parallel.tp. Refuses, naming the model keys, a TP that
    does not divide them."""
    tp = cfg.parallel.tp if chunk_tp is None else chunk_tp
    try:
        return Chunking.for_model(cfg.model, tp)
    except ChunkingError as e:
        whose = (f"parallel.tp = {tp} of {cfg.source}" if chunk_tp is None
                 else f"--chunks-tp {tp}")
        raise mapping.ConversionError(
            f"cannot store the tensors in the chunks of {whose}: {e}; convert with a TP that "
            "divides them (--chunks-tp N), or --chunks-tp 1 for whole layers, which load at any "
            "TP") from None


def _part_names(target: mapping.Target, chunking: Chunking) -> list[tuple[int, str]]:
    """(TP rank, part directory name) of each part the target is written in: one part per TP
    rank whose pieces are stored; at TP1 one part per tensor, named as before the chunking."""
    if chunking.tp == 1:
        return [(0, "")]
    return [(r, f"_tp{r}") for r in chunking.owners(target.key, target.shape)]


def _pieces(sharded: dict, chunking: Chunking) -> dict[int, dict]:
    """The filled entries of one tensor, split into stored pieces, by TP rank."""
    out: dict[int, dict] = {}
    for name, sh in sharded.items():
        for rank, pieces in chunking.split(sh).items():
            for j, piece in enumerate(pieces):
                out.setdefault(rank, {})[f"{name}@{rank}.{j}"] = piece
    return out


def convert(hf_dir: str | Path, cfg: Config, out_dir: str | Path, *, chunk_tp: int | None = None,
            log=print, progress_interval_s: float = 5.0) -> ConvertResult:
    """Convert the Hugging Face checkpoint hf_dir for the model of cfg into out_dir, each tensor
    stored in the chunks megatron-core requests at TP `chunk_tp` (default: cfg's parallel.tp;
    1: whole layers)."""
    t0 = time.monotonic()
    hf = HFCheckpoint(hf_dir)
    mapping.check(hf.tensors, hf.config, cfg.model, str(hf.dir))   # raises before any write
    chunking = chunking_for(cfg, chunk_tp)                            # so does this
    out = Path(out_dir)
    dtype = params_dtype(cfg)
    targets = mapping.targets(cfg.model)
    with single_process_megatron():
        tensors, objects = _index_template(sharded_template(cfg), cfg)
        fp = _fingerprint(hf, cfg, dtype, chunking)
        parts = _check_out(out, fp)
        names = [_part_names(t, chunking) for t in targets]
        target_parts = [[(r, parts / f"p{i:05d}{suffix}") for r, suffix in ns]
                        for i, ns in enumerate(names)]
        part_dirs = [parts / "p_objects"] + [d for tp_parts in target_parts for _, d in tp_parts]
        src_bytes = [sum(hf.tensors[s].nbytes for s in t.sources) for t in targets]
        done = [all(part_done(d) for _, d in tp_parts) for tp_parts in target_parts]
        _check_disk(_existing(out), [t for t, ok in zip(targets, done) if not ok], dtype)
        # every check passed: from here on, files are written
        parts.mkdir(parents=True, exist_ok=True)
        (parts / FINGERPRINT).write_text(json.dumps(fp, indent=1) + "\n")
        if not part_done(part_dirs[0]):
            save_part(objects, part_dirs[0])
        resumed = sum(done)
        already = sum(b for b, ok in zip(src_bytes, done) if ok)
        log(f"convert: {len(targets)} Megatron tensors from {len(hf.tensors)} Hugging Face "
            f"tensors, {human_bytes(hf.total_bytes)} -> {out} ({str(dtype).split('.')[-1]}, "
            + ("whole layers" if chunking.tp == 1 else f"in the chunks of TP{chunking.tp}") + ")"
            + (f"; resuming, {resumed} already written" if resumed else ""))
        bar = ByteProgress("convert", sum(src_bytes), already=already,
                           interval_s=progress_interval_s)
        for target, tp_parts, nbytes, ok in zip(targets, target_parts, src_bytes, done):
            if ok:
                continue
            _, entry = tensors[(target.key, target.layer)]
            tensor = mapping.fill(target, cfg.model, hf.read, dtype)
            # one part per TP rank: Megatron's writer copies a view before writing it, so only
            # one rank's pieces are copied at a time
            pieces = _pieces(_filled(entry, tensor), chunking)
            for rank, part in tp_parts:
                if not part_done(part):
                    save_part(pieces[rank], part)
            del tensor, pieces
            bar.update(nbytes, target.label)
        join(part_dirs, out)
    result = ConvertResult(out_dir=out, tensors=len(targets), bytes_read=bar.done - already,
                           seconds=time.monotonic() - t0, resumed_parts=resumed,
                           dtype=str(dtype).split(".")[-1])
    # the model record, last (checkpoint.format); the vocab rows are stored unpadded (mapping)
    write_model_info(out, cfg, stored_vocab_rows=cfg.model.vocab_size, extra={"converted_from": {
        "format": "huggingface-safetensors", "source": str(hf.dir.resolve()),
        "config": cfg.source, "dtype": result.dtype, "tensors": result.tensors,
        "source_bytes": hf.total_bytes}, RECORD_KEY: chunking.record()})
    shutil.rmtree(parts)
    log(f"convert: done, {len(targets)} tensors, {human_bytes(hf.total_bytes)} in "
        f"{human_seconds(result.seconds)} -> {out}")
    return result
