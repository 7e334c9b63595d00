#!/usr/bin/env python3
"""First contact on a bare single-H200 test machine (torch 2.11 / CUDA 13 preinstalled, no
Transformer Engine, no megatron-core, no network; at most 64 MiB carried with the repository),
in one prepared command. Three subcommands:

  python scripts/h200_first_contact.py gather [--dest .whl]      # development machine (network)
  python scripts/h200_first_contact.py check  [--wheels .whl]    # development machine (offline)
  python3 scripts/h200_first_contact.py run OUT [--wheels .whl]  # the H200

gather  downloads the wheels the image lacks (WHEELS: megatron-core and mlperf-logging, x86-64,
        CPython 3.12 like the image's python3) into an ignored folder (.whl/), refuses more than
        64 MiB, then runs `check`.
check   installs those wheels offline into an empty --target folder and, in a `python -S`
        process whose path holds only the repository, that folder and this machine's copies of
        the packages the image has (IMAGE_PACKAGES; symbolic links to this environment's
        installs of them), imports every module of the project and the modules first-contact
        imports lazily, then runs `first-contact --cpu` on the tiny config there (the no-TE
        path as far as a CPU goes). Exit status 1 on an ImportError that the image would see.
run     on the H200: installs the wheels offline (pip --no-index --no-deps --target), then runs
        first-contact's phases, each in its own process with its own time limit, so that a
        hang in one still leaves the others' figures: layer (P4: BF16 matrix ceiling, one
        405B-width layer's forward and backward, MFU, planner ratio), slice (the one-GPU slice
        on Megatron's local layers in BF16), dp2 (not run with one GPU). Writes to OUT:
        env.txt (GPU, driver, versions), log.txt (everything the phases printed), layer.json,
        slice.json, dp2.json (each rewritten after every check, so a timeout keeps what was
        reached), report.json (all checks merged) and summary.txt (one line per check). Ends
        within --deadline-s (default 450 s, under the 8 minutes asked).

With the device tool of this workplace (docs/gpu_settings.md, "First contact on a test H200"):
  run(command="python3 scripts/h200_first_contact.py run $OUT", carry=[".whl"], timeout_s=540)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = {"megatron-core": "0.19.2", "mlperf-logging": "4.1.68"}
"""What the project imports on the H200 that its image lacks (pyproject.toml's dependencies
minus IMAGE_PACKAGES; megatron-core's own requirements torch, numpy and packaging and
mlperf-logging's pandas, pyyaml, numpy and scipy are in the image). Pinned as constraints/cpu.txt."""
CARRY_LIMIT = 64 * 2**20
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
IMAGE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch
grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp
""".split()
"""The Python packages of the H200 test image ('cuda', python3 = CPython 3.12.3 with torch
2.11.0+cu130), as read there with pip on 2026-11-17 and recorded in this workplace's notes on
its device machines; versions seen there include numpy 2.5.2, safetensors 0.8.0, sentencepiece
0.2.2, transformers 5.17.0, triton 3.6.0."""
LAZY_IMPORTS = ("megatron.core.full_cuda_graph", "megatron.core.distributed",
                "megatron.core.optimizer", "megatron.core.models.gpt",
                "megatron.core.models.gpt.gpt_layer_specs", "megatron.core.dist_checkpointing",
                "megatron.core.pipeline_parallel", "megatron.core.transformer.spec_utils",
                "megatron.core.tensor_parallel.random", "megatron.core.num_microbatches_calculator",
                "mlperf_logging.mllog", "mlperf_logging.compliance_checker", "yaml", "safetensors",
                "sentencepiece", "matplotlib", "psutil", "numpy", "torch")
"""Modules the first-contact and training paths import inside functions."""
TE_MODULES = ("transformer_engine",)
TINY = REPO / "configs" / "tiny_cpu.toml"


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -- gather ---------------------------------------------------------------------------------------
def gather(dest: Path) -> int:
    dest.mkdir(parents=True, exist_ok=True)
    for f in dest.glob("*.whl"):
        if norm(f.name.split("-")[0]) in WHEELS:
            f.unlink()                  # one version of each: two stop the offline install
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    cmd += [f"{n}=={v}" for n, v in WHEELS.items()]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return check(dest)


def wheel_files(wheels: Path) -> list[Path]:
    files = sorted(wheels.glob("*.whl"))
    names = [norm(f.name.split("-")[0]) for f in files]
    missing = sorted(set(WHEELS) - set(names))
    if missing:
        raise SystemExit(f"error: {wheels} lacks {', '.join(missing)}: run "
                         f"`python scripts/h200_first_contact.py gather` on a machine with network")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SystemExit(f"error: {wheels} holds more than one version of {', '.join(dup)}")
    size = sum(f.stat().st_size for f in files)
    if size > CARRY_LIMIT:
        raise SystemExit(f"error: {wheels} holds {size / 2**20:.1f} MiB; at most 64 MiB travel")
    return files


# -- check ----------------------------------------------------------------------------------------
def link_dists(dest: Path, names) -> tuple[list[str], list[str]]:
    """Symbolic links in `dest` to this environment's installs of the distributions `names`
    (each top-level module and its .dist-info); returns (linked, absent here)."""
    import importlib.metadata as md
    want = {norm(n) for n in names}
    dest.mkdir(parents=True, exist_ok=True)
    linked = set()
    for dist in md.distributions():
        name = norm(dist.metadata["Name"] or "")
        if name not in want or name in linked or not dist.files:
            continue
        base = Path(dist.locate_file(""))
        for f in dist.files:
            top = Path(f).parts[0]
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            link = dest / top
            if not link.exists() and (base / top).exists():
                link.symlink_to(base / top)
        linked.add(name)
    return sorted(linked), sorted(want - linked)


def image_site(dest: Path) -> tuple[list[str], list[str]]:
    """The image's packages (IMAGE_PACKAGES) as links to this environment's installs."""
    return link_dists(dest, IMAGE_PACKAGES)


_PROBE = r"""
import importlib, json, pkgutil, sys, traceback
sys.path[:0] = json.loads(sys.argv[1])
lazy = json.loads(sys.argv[2])
walk = json.loads(sys.argv[3])
out = {}
import llama31_405b
names = [m.name for m in pkgutil.walk_packages(llama31_405b.__path__, "llama31_405b.")
         if not m.name.endswith(".__main__")] if walk else []
for name in names + lazy:
    try:
        importlib.import_module(name)
    except ImportError as e:
        out[name] = [getattr(e, "name", None) or "", f"{type(e).__name__}: {e}"]
    except Exception as e:          # noqa: BLE001 - reported, not an ImportError
        out[name] = ["", f"not an import error: {type(e).__name__}: {e}"]
import megatron.core, torch
print(json.dumps({"failed": out, "modules": len(names) + len(lazy),
                  "megatron": megatron.core.__file__, "torch": torch.__version__}))
"""


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def probe(path: list[str], absent: list[str], modules=None) -> dict[str, str]:
    """Import every project module and LAZY_IMPORTS (or only `modules`) in a `python -S`
    process whose path is `path` alone; returns the ImportErrors the image would see (module ->
    message). Modules that need Transformer Engine, and packages of the image this environment
    lacks (`absent`), are reported, not counted."""
    r = subprocess.run([sys.executable, "-S", "-c", _PROBE, json.dumps(path),
                        json.dumps(list(modules or LAZY_IMPORTS)), json.dumps(modules is None)],
                       capture_output=True, text=True,
                       env=clean_env(), cwd=tempfile.gettempdir())
    if r.returncode != 0:
        return {"<probe>": f"the import probe failed: {r.stdout[-2000:]} {r.stderr[-3000:]}"}
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"imported {res['modules']} modules from a clean path (megatron from "
          f"{Path(res['megatron']).parents[1]}, torch {res['torch']})")
    absent_mods = {n.replace("-", "_") for n in absent}
    real = {}
    for mod, (missing, msg) in res["failed"].items():
        top = missing.split(".")[0]
        if top in TE_MODULES:
            print(f"  {mod}: needs Transformer Engine (absent on the H200 by design)")
        elif top and (top in absent_mods or norm(top) in absent):
            print(f"  {mod}: {top} is in the image but not in this environment")
        else:
            real[mod] = msg
    return real


def check(wheels: Path, *, run_cpu: bool = True) -> int:
    files = wheel_files(wheels)
    size = sum(f.stat().st_size for f in files)
    print(f"wheels ({size / 2**20:.1f} MiB of the 64 MiB carry limit):")
    for f in files:
        print(f"  {f.name}  {f.stat().st_size / 2**20:.1f} MiB")
    with tempfile.TemporaryDirectory(prefix="h200_check_") as tmp:
        target, image = Path(tmp) / "site", Path(tmp) / "image"
        image.mkdir()
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--target", str(target), *map(str, files)], check=True)
        linked, absent = image_site(image)
        print(f"image packages emulated from this environment: {len(linked)} of "
              f"{len(IMAGE_PACKAGES)} (absent here, so not importable in this check: "
              f"{', '.join(absent) or 'none'})")
        path = [str(REPO), str(target), str(image)]
        real = probe(path, absent)
        for mod, msg in real.items():
            print(f"  IMPORT ERROR {mod}: {msg}")
        if real:
            return 1
        print("no ImportError the H200 image would see")
        if not run_cpu:
            return 0
        print("first-contact --cpu (tiny config) with only these packages:", flush=True)
        env = clean_env()
        env["PYTHONPATH"] = os.pathsep.join(path)
        r = subprocess.run([sys.executable, "-S", "-m", "llama31_405b", "first-contact", "--cpu",
                            "--config", str(TINY), "--phases", "slice", "--steps", "1",
                            "--report", str(Path(tmp) / "cpu.json")], env=env, cwd=REPO,
                           capture_output=True, text=True)
        print(r.stdout)
        if r.returncode != 0:
            print(r.stderr[-3000:])
            return 1
        doc = json.loads((Path(tmp) / "cpu.json").read_text())
        bad = [c["name"] for c in doc["checks"] if c["name"] in
               ("build", "checkpoint_save", "checkpoint_load", "warmup_and_graphs",
                "replay_equals_eager", "steps", "evaluation") and c["status"] != "passed"]
        if bad:
            print(f"error: first-contact --cpu did not pass {', '.join(bad)}")
            return 1
    return 0


# -- run (on the H200) ----------------------------------------------------------------------------
def _sh(cmd: str) -> str:
    try:
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30)
        return f"$ {cmd}\n{r.stdout}{r.stderr}\n"
    except subprocess.TimeoutExpired:
        return f"$ {cmd}\n(no answer in 30 s)\n"


def run(out: Path, wheels: Path, deadline_s: float, config: str, install: bool = True) -> int:
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "log.txt", "a", buffering=1)

    def say(msg):
        line = f"[{time.monotonic() - t0:6.1f} s] {msg}"
        print(line, flush=True)
        log.write(line + "\n")

    site = Path(tempfile.gettempdir()) / "h200_first_contact_site"
    if install:
        shutil.rmtree(site, ignore_errors=True)
        files = wheel_files(wheels)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                            "--no-deps", "--no-compile", "--no-cache-dir", "--target", str(site),
                            *map(str, files)], capture_output=True, text=True)
        say(f"pip install of {', '.join(f.name for f in files)}: exit {r.returncode} "
            f"{r.stderr[-500:]}")
        if r.returncode != 0:
            return 1
    else:
        say("--no-install: using the packages this Python already has")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + ([str(site)] if install else [])
        + [p for p in [os.environ.get("PYTHONPATH")] if p]), PYTHONUNBUFFERED="1")
    (out / "env.txt").write_text(
        _sh("nvidia-smi") + _sh(f"{sys.executable} -VV")
        + _sh(f"{sys.executable} -c 'import torch; print(torch.__version__, torch.version.cuda, "
              "torch.cuda.device_count(), torch.backends.cudnn.version())'")
        + _sh(f"{sys.executable} -m pip list 2>/dev/null | grep -iE "
              "'^(torch|triton|numpy|megatron|mlperf|transformer|apex|pandas|scipy|pyyaml) '")
        + _sh("df -h /tmp; free -g; nproc"))
    say("env.txt written")
    # phase, hard limit (s), seconds kept back for the phases after it (of a 450 s deadline;
    # scaled with it). Expected on one H200: layer ~1 min, slice ~3 min, dp2 seconds (one GPU)
    plan = [("layer", 150, 240), ("slice", 330, 30), ("dp2", 240, 5)]
    for phase, cap, keep in plan:
        left = deadline_s - (time.monotonic() - t0)
        limit = min(cap, left - keep * deadline_s / 450)
        if limit < 20:
            say(f"phase {phase}: not run, {left:.0f} s left")
            continue
        cmd = [sys.executable, "-m", "llama31_405b", "first-contact", "--config", config,
               "--phases", phase, "--report", str(out / f"{phase}.json"),
               "--budget-s", str(int(limit - 10)), "--traceback"]
        say(f"phase {phase}: limit {limit:.0f} s: {' '.join(cmd[1:])}")
        try:
            p = subprocess.run(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                               timeout=limit)
            say(f"phase {phase}: exit {p.returncode}")
        except subprocess.TimeoutExpired:
            say(f"phase {phase}: killed at its {limit:.0f} s limit (its report keeps what it "
                "reached)")
    for f in out.glob("*.tmp"):
        f.unlink()                       # a report cut off mid-write by a kill
    merged, lines = merge(out, [p for p, _, _ in plan])
    (out / "report.json").write_text(json.dumps(merged, indent=2))
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    say(f"done in {time.monotonic() - t0:.0f} s\n" + "\n".join(lines))
    return 1 if merged["summary"]["failed"] else 0


def merge(out: Path, phases: list[str]) -> tuple[dict, list[str]]:
    """One report: each phase's own checks from that phase's process ("phase P left no report"
    if it wrote none); the common checks (gpu, transformer_engine, ...) from the first process
    that ran them."""
    owner = {"matmul_ceiling": "layer", "layer_bf16": "layer", "dp2_eval_sync": "dp2"}
    common = ("gpu", "transformer_engine", "recipe", "gradient_accumulation_fusion")
    docs = {p: json.loads((out / f"{p}.json").read_text()) for p in phases
            if (out / f"{p}.json").exists()}
    names = [c["name"] for d in docs.values() for c in d["checks"]]
    names = list(dict.fromkeys(names or list(common) + list(owner)))
    checks = {}
    for n in names:
        entries = {p: c for p, d in docs.items() for c in d["checks"] if c["name"] == n}
        if n in common:
            ran = [c for c in entries.values() if c["status"] != "not run"]
            checks[n] = ran[0] if ran else next(iter(entries.values()))
            continue
        p = owner.get(n, "slice")
        checks[n] = entries.get(p) or {"name": n, "status": "not run", "seconds": 0, "data": {},
                                       "detail": f"phase {p} left no report"}
    summary = {s: sum(c["status"] == s for c in checks.values())
               for s in ("passed", "failed", "not run")}
    w = max((len(n) for n in checks), default=0)
    lines = [f"{n:<{w}}  {c['status']:<7}  {c['detail'].splitlines()[0] if c['detail'] else ''}"
             for n, c in checks.items()]
    lines.append(f"{summary['failed']} failed, {summary['passed']} passed, "
                 f"{summary['not run']} not run")
    return {"meta": {p: d.get("meta", {}) for p, d in docs.items()}, "summary": summary,
            "checks": list(checks.values())}, lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gather", help="download the wheels (development machine, network)")
    g.add_argument("--dest", default=str(REPO / ".whl"))
    c = sub.add_parser("check", help="check the wheels against the image's packages (offline)")
    c.add_argument("--wheels", default=str(REPO / ".whl"))
    c.add_argument("--imports-only", action="store_true", help="skip the first-contact --cpu run")
    r = sub.add_parser("run", help="on the H200: install offline, run first-contact")
    r.add_argument("out", help="output folder (the device tool's $OUT)")
    r.add_argument("--wheels", default=str(REPO / ".whl"))
    r.add_argument("--deadline-s", type=float, default=450.0)
    r.add_argument("--config", default=str(REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"))
    r.add_argument("--no-install", action="store_true",
                   help="use the packages this Python has (a machine that has megatron-core)")
    a = ap.parse_args(argv)
    if a.cmd == "gather":
        return gather(Path(a.dest))
    if a.cmd == "check":
        return check(Path(a.wheels), run_cpu=not a.imports_only)
    return run(Path(a.out), Path(a.wheels), a.deadline_s, a.config, install=not a.no_install)


if __name__ == "__main__":
    sys.exit(main())
