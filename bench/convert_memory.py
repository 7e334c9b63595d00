"""Peak memory of `checkpoint convert` against the largest tensor it has to hold.

Writes a random Llama 3.1-shaped Hugging Face checkpoint of a few hundred MB (BF16, sharded
safetensors with an index, like Meta's release) into a temporary directory, then runs
`python -m llama31_405b checkpoint convert` in a fresh process and prints the RSS after imports,
the peak RSS of the conversion, the largest Megatron tensor (embedding or fused fc1) and
(peak - start) / largest tensor. The converter streams tensor by tensor, so that ratio is a small
constant however large the model (1.3 measured at 8 and at 16 layers); it is printed next to the
checkpoint size for comparison.

    PYTHONPATH=$PWD .venv/bin/python bench/convert_memory.py [--layers 8 --hidden 1024 ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_hf(directory: Path, a) -> None:
    """Random BF16 Llama tensors written shard by shard (never the whole model in memory)."""
    import torch
    from safetensors.torch import save_file
    h, f, L, V, nh, nkv = a.hidden, a.ffn, a.layers, a.vocab, a.heads, a.kv_heads
    d = h // nh
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
        "intermediate_size": f, "num_hidden_layers": L, "num_attention_heads": nh,
        "num_key_value_heads": nkv, "head_dim": d, "vocab_size": V, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}))
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: (torch.randn(*s, generator=g) * 0.02).bfloat16()  # noqa: E731
    groups = [{"model.embed_tokens.weight": rnd(V, h)}]
    for i in range(L):
        p = f"model.layers.{i}."
        groups.append({
            p + "input_layernorm.weight": torch.ones(h).bfloat16(),
            p + "post_attention_layernorm.weight": torch.ones(h).bfloat16(),
            p + "self_attn.q_proj.weight": rnd(nh * d, h),
            p + "self_attn.k_proj.weight": rnd(nkv * d, h),
            p + "self_attn.v_proj.weight": rnd(nkv * d, h),
            p + "self_attn.o_proj.weight": rnd(h, nh * d),
            p + "mlp.gate_proj.weight": rnd(f, h), p + "mlp.up_proj.weight": rnd(f, h),
            p + "mlp.down_proj.weight": rnd(h, f)})
    groups.append({"model.norm.weight": torch.ones(h).bfloat16(), "lm_head.weight": rnd(V, h)})
    weight_map = {}
    for n, tensors in enumerate(groups):
        name = f"model-{n + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(tensors, str(directory / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})
        del tensors
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def write_config(path: Path, a) -> None:
    path.write_text(f"""base = "{ROOT / 'configs' / 'tiny_cpu.toml'}"
[model]
num_layers = {a.layers}
hidden_size = {a.hidden}
ffn_hidden_size = {a.ffn}
num_attention_heads = {a.heads}
num_query_groups = {a.kv_heads}
kv_channels = {a.hidden // a.heads}
vocab_size = {a.vocab}
[precision]
compute = "bf16"
params = "bf16"
[run]
division = "open"
""")


# The child imports everything first, then resets the kernel's peak-RSS counter (VmHWM, via
# /proc/self/clear_refs), so the peak it reports at exit is the conversion's alone, not the
# transient peak of importing torch and megatron (which is larger than the whole conversion of
# this model). It prints the RSS at the reset and the peak after it.
CONVERT = """
import atexit, sys, runpy
import torch, megatron.core, megatron.core.dist_checkpointing
import llama31_405b.checkpoint.convert, llama31_405b.cli.checkpoint_cmd

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
print("START_KB", status("VmRSS"), file=sys.stderr)
atexit.register(lambda: print("PEAK_KB", status("VmHWM"), file=sys.stderr))
sys.argv = ["llama31_405b", *sys.argv[1:]]
runpy.run_module("llama31_405b", run_name="__main__")
"""


def run_child(cmd: list[str], env: dict) -> tuple[float, float, float]:
    """(RSS after imports, peak RSS after that, seconds) of the converter in a child process."""
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd[:3])}\n{proc.stdout[-3000:]}")
    kb = {line.split()[0]: int(line.split()[1]) * 1024.0 for line in proc.stdout.splitlines()
          if line.startswith(("START_KB", "PEAK_KB"))}
    return kb["START_KB"], kb["PEAK_KB"], time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=3584)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32768)
    a = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    with tempfile.TemporaryDirectory(prefix="convert_memory_") as tmp:
        tmp = Path(tmp)
        hf, out, cfg = tmp / "hf", tmp / "megatron", tmp / "model.toml"
        write_hf(hf, a)
        write_config(cfg, a)
        hf_bytes = sum(p.stat().st_size for p in hf.glob("*.safetensors"))
        base, peak, secs = run_child([sys.executable, "-c", CONVERT, "checkpoint", "convert",
                                "--hf", str(hf), "--config", str(cfg), "--out", str(out)], env)
        out_bytes = sum(p.stat().st_size for p in out.iterdir())
    bf16 = 2
    largest = max(a.vocab * a.hidden, 2 * a.ffn * a.hidden) * bf16
    mb = lambda x: f"{x / 1e6:8.1f} MB"  # noqa: E731
    print(f"model: {a.layers} layers, hidden {a.hidden}, ffn {a.ffn}, vocab {a.vocab} (BF16)")
    print(f"Hugging Face checkpoint     {mb(hf_bytes)}")
    print(f"Megatron checkpoint written {mb(out_bytes)}  in {secs:.1f} s "
          f"({hf_bytes / secs / 1e6:.1f} MB/s incl. start-up)")
    print(f"largest Megatron tensor     {mb(largest)}")
    print(f"RSS after imports (torch, megatron)  {mb(base)}")
    print(f"peak RSS during the conversion       {mb(peak)}")
    print(f"(peak - start) / largest tensor = {(peak - base) / largest:.2f}   "
          f"(peak - start) / checkpoint = {(peak - base) / hf_bytes:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
