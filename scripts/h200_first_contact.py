#!/usr/bin/env python3
"""First contact on a bare single-H200 test machine (torch 2.11 / CUDA 13 preinstalled, no
Transformer Engine, no megatron-core, no network; at most 64 MiB carried with the repository),
in one prepared command. Four subcommands:

  .venv/bin/python scripts/h200_first_contact.py gather [--dest .whl]   # development machine
  .venv/bin/python scripts/h200_first_contact.py check [--wheels .whl]  # (gather: network)
  python3 scripts/h200_first_contact.py run OUT [--phases P,..]         # the H200
  .venv/bin/python scripts/h200_first_contact.py merge DEST RUN...      # the runs' folders

gather  downloads the wheels the image lacks (WHEELS: megatron-core and mlperf-logging, x86-64,
        CPython 3.12 like the image's python3) into an ignored folder (.whl/), refuses more than
        64 MiB, then runs `check`. gather and check need Python 3.12 (they install cp312
        wheels): another Python re-runs them with the project's .venv/bin/python, or refuses.
check   installs those wheels offline into an empty --target folder and, in a `python -S`
        process whose path holds only the repository, that folder and this machine's copies of
        the packages the image has (IMAGE_PACKAGES; symbolic links to this environment's
        installs of them), imports every module of the project and the modules first-contact
        imports lazily, then runs `first-contact --cpu` on the tiny config there (the no-TE
        path as far as a CPU goes). Exit status 1 on an ImportError that the image would see.
run     on the H200: installs the wheels offline (pip --no-index --no-deps --target), then runs
        first-contact's phases (PHASES), each in its own process with its own time limit, so
        that a hang in one still leaves the others' figures: layer (BF16 and FP8 matrix
        ceilings and the TP4 shard's GEMMs, one 405B-width layer's forward and backward, MFU,
        planner ratios, the NVFP4 emulation), slice (the one-GPU slice on Megatron's local
        layers in BF16), dp2 (not started with one GPU). Writes to OUT: env.txt (GPU, driver,
        versions), log.txt (everything the phases printed), layer.json, slice.json, dp2.json
        (each rewritten after every figure or check, so a kill keeps what was reached),
        report.json (every check from the phase that runs it) and summary.txt (one line per
        check). Ends within --deadline-s (DEADLINE_S). `--phases slice` reruns a failed phase
        alone; into a folder holding an earlier run's files it writes NAME.2.EXT (h200_outputs:
        nothing is overwritten, the merge takes each phase's latest report).
merge   copies the folders of several runs (a first run, then a phase rerun alone) into DEST,
        under new names, and writes their merged report and summary there.

With the device tool of this workplace (docs/gpu_settings.md, "First contact on a test H200"):
  run(command="python3 scripts/h200_first_contact.py run $OUT", carry=[".whl"], timeout_s=240)
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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple, cast

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import h200_outputs as outputs  # noqa: E402  (beside this file: tags, merge, collect)
from h200_outputs import merge as _merge, not_started, tagged  # noqa: E402
WHEELS = {"megatron-core": "0.19.2", "mlperf-logging": "4.1.68"}
"""What the project imports on the H200 that its image lacks (pyproject.toml's dependencies
minus IMAGE_PACKAGES; megatron-core's own requirements torch, numpy and packaging and
mlperf-logging's pandas, pyyaml, numpy and scipy are in the image). Pinned as constraints/cpu.txt."""
CARRY_LIMIT = 64 * 2**20
PYTHON = (3, 12)
"""The image's python3 (CPython 3.12.3): the wheels are for it."""
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
                "megatron.core.typed_torch",
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
        raise SystemExit(f"error: {wheels} lacks {', '.join(missing)}: run `.venv/bin/python "
                         "scripts/h200_first_contact.py gather` on a machine with network")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SystemExit(f"error: {wheels} holds more than one version of {', '.join(dup)}")
    size = sum(f.stat().st_size for f in files)
    if size > CARRY_LIMIT:
        raise SystemExit(f"error: {wheels} holds {size / 2**20:.1f} MiB; at most 64 MiB travel")
    return files


# -- check ----------------------------------------------------------------------------------------
def link_dists(dest: Path, names: Iterable[str]) -> tuple[list[str], list[str]]:
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
        # an installed (path) distribution's: a pathlib.Path (typeshed: SimplePath)
        base = Path(cast("os.PathLike[str]", dist.locate_file("")))
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


def probe(path: list[str], absent: list[str], modules: Sequence[str] | None = None
          ) -> dict[str, str]:
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
class Phase(NamedTuple):
    """A phase `run` starts, in its own process (`first-contact --phases NAME`)."""
    name: str
    cap_s: float
    """Hard limit of its process, unless no phase is started after it (then: what is left)."""
    floor_s: float
    """Kept back for it by the phases before it; with less left it is not started."""
    gpus: int = 1
    """GPUs it needs: where nvidia-smi -L lists fewer it is not started (its checks "not run"
    with the reason; the process would spend ~15 s of imports to say the same)."""
    args: tuple[str, ...] = ()
    """More first-contact arguments; "{out}" becomes OUT and "{tag}" the run's tag: a phase's
    extra output goes to OUT as f"NAME{tag}.EXT", so that a rerun into OUT never overwrites it,
    and is named in EXTRA_OUTPUTS."""


PHASES = (Phase("layer", 75, 30), Phase("slice", 150, 90), Phase("dp2", 90, 30, gpus=2))
"""The phases in the order `run` starts them. Expected on one H200 (estimates: never run yet):
install and env.txt 15 s, layer under a minute, slice 2-3 minutes, dp2 not started."""
EXTRA_OUTPUTS: dict[str, tuple[str, ...]] = {"slice": ("profile_slice.tgz",)}  # profiling.pack_path
"""Phase -> files it writes into OUT besides its report (names untagged, e.g. "profile.tar")."""
RUN_FILES = ("env.txt", "log.txt", "report.json", "summary.txt")
DEADLINE_S = 225.0
"""`run` ends within this (the device command's timeout_s 240 leaves 15 s to the tool)."""
INSTALL_TIMEOUT_S = 45
SH_TIMEOUT_S = 8


def _sh(cmd: str) -> str:
    try:
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=SH_TIMEOUT_S)
        return f"$ {cmd}\n{r.stdout}{r.stderr}\n"
    except subprocess.TimeoutExpired:
        return f"$ {cmd}\n(no answer in {SH_TIMEOUT_S} s)\n"


def run_names() -> list[str]:
    return [*RUN_FILES, *(f"{p.name}.json" for p in PHASES),
            *(n for names in EXTRA_OUTPUTS.values() for n in names)]


def run_tag(out: Path) -> str:
    return outputs.run_tag(out, run_names())


def merge(out: Path, phases: list[str] | None = None) -> tuple[dict, list[str]]:
    """h200_outputs.merge of `phases` (default: every phase of PHASES)."""
    return _merge(out, phases or [p.name for p in PHASES])


def gpu_count() -> int | None:
    """GPUs nvidia-smi -L lists; None where it does not answer (then every phase starts)."""
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                           timeout=SH_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return sum(line.startswith("GPU ") for line in r.stdout.splitlines())


def run(out: Path, wheels: Path, deadline_s: float, config: str, install: bool = True,
        phases: list[str] | None = None, gpus: int | None = None) -> int:
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    tag = run_tag(out)
    log = open(out / tagged("log.txt", tag), "a", buffering=1)

    def say(msg: str) -> None:
        line = f"[{time.monotonic() - t0:6.1f} s] {msg}"
        print(line, flush=True)
        log.write(line + "\n")

    known = [p.name for p in PHASES]
    phases = phases or known
    if sorted(set(phases) - set(known)):
        say(f"error: unknown phase(s) {', '.join(sorted(set(phases) - set(known)))}; known: "
            f"{', '.join(known)}")
        return 2
    if tag:
        say(f"{out} holds an earlier run's files: this run's end in {tag} (nothing overwritten)")
    site = Path(tempfile.gettempdir()) / "h200_first_contact_site"
    if install:
        if sys.version_info[:2] != PYTHON:
            say(f"error: the wheels are for CPython {PYTHON[0]}.{PYTHON[1]} (megatron-core ships "
                f"cp312 wheels only); this is {sys.version.split()[0]}: run it with python3.12")
            return 2
        shutil.rmtree(site, ignore_errors=True)
        files = wheel_files(wheels)
        try:
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                                "--no-deps", "--no-compile", "--no-cache-dir", "--target",
                                str(site), *map(str, files)], capture_output=True, text=True,
                               timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            say(f"pip install: killed at its {INSTALL_TIMEOUT_S} s limit")
            return 1
        say(f"pip install of {', '.join(f.name for f in files)}: exit {r.returncode} "
            f"{r.stderr[-500:]}")
        if r.returncode != 0:
            return 1
    else:
        say("--no-install: using the packages this Python already has")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + ([str(site)] if install else [])
        + [p for p in [os.environ.get("PYTHONPATH")] if p]), PYTHONUNBUFFERED="1")
    (out / tagged("env.txt", tag)).write_text(
        _sh("nvidia-smi") + _sh(f"{sys.executable} -VV")
        + _sh(f"{sys.executable} -c 'import torch; print(torch.__version__, torch.version.cuda, "
              "torch.cuda.device_count(), torch.backends.cudnn.version())'")
        + _sh(f"{sys.executable} -m pip list 2>/dev/null | grep -iE "
              "'^(torch|triton|numpy|megatron|mlperf|transformer|apex|pandas|scipy|pyyaml) '")
        + _sh("df -h /tmp; free -g; nproc"))
    say("env.txt written")
    gpus = gpu_count() if gpus is None else gpus
    plan = []
    for ph in PHASES:
        if ph.name not in phases:
            continue
        if gpus is not None and gpus < ph.gpus:
            why = f"needs {ph.gpus} GPUs (nvidia-smi -L lists {gpus}): not started"
            not_started(out / tagged(f"{ph.name}.json", tag), ph.name, why)
            say(f"phase {ph.name}: {why}")
        else:
            plan.append(ph)
    for i, ph in enumerate(plan):
        left = deadline_s - (time.monotonic() - t0)
        reserve = sum(q.floor_s for q in plan[i + 1:])
        limit = left - reserve if i == len(plan) - 1 else min(ph.cap_s, left - reserve)
        report = out / tagged(f"{ph.name}.json", tag)
        if limit < ph.floor_s:
            why = (f"not started: {left:.0f} s left of the {deadline_s:.0f} s deadline, "
                   f"{reserve:.0f} s kept for the phases after it; it needs {ph.floor_s:.0f} s")
            not_started(report, ph.name, why)
            say(f"phase {ph.name}: {why}")
            continue
        cmd = [sys.executable, "-m", "llama31_405b", "first-contact", "--config", config,
               "--phases", ph.name, "--report", str(report),
               "--budget-s", str(int(limit - 10)), "--traceback",
               *(a.format(out=out, tag=tag) for a in ph.args)]
        say(f"phase {ph.name}: limit {limit:.0f} s: {' '.join(cmd[1:])}")
        try:
            p = subprocess.run(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                               timeout=limit)
            say(f"phase {ph.name}: exit {p.returncode}")
        except subprocess.TimeoutExpired:
            say(f"phase {ph.name}: killed at its {limit:.0f} s limit (its report keeps what it "
                "reached)")
    for f in out.glob("*.tmp"):
        f.unlink()                       # a report cut off mid-write by a kill
    merged, lines = merge(out)
    (out / tagged("report.json", tag)).write_text(json.dumps(merged, indent=2))
    (out / tagged("summary.txt", tag)).write_text("\n".join(lines) + "\n")
    say(f"done in {time.monotonic() - t0:.0f} s\n" + "\n".join(lines))
    return 1 if merged["summary"]["failed"] else 0


def python_for_wheels(version: Sequence[int] | None = None,
                      venv: Path = REPO / ".venv" / "bin" / "python") -> str | None:
    """None when this Python is 3.12 (what the wheels are for: megatron-core ships cp312 wheels
    only, and `check` installs them into this Python); else the project's environment's python
    to run gather and check with, when it is a 3.12; else SystemExit naming the version."""
    version = tuple(version or sys.version_info[:2])
    if version == PYTHON:
        return None
    if venv.exists():
        r = subprocess.run([str(venv), "-c", "import sys; print(*sys.version_info[:2])"],
                           capture_output=True, text=True)
        if r.returncode == 0 and tuple(map(int, r.stdout.split())) == PYTHON:
            return str(venv)
    raise SystemExit(
        f"error: gather and check need Python {PYTHON[0]}.{PYTHON[1]} (megatron-core 0.19.2 "
        f"ships cp312 wheels only, and check installs them into this Python); this is "
        f"{version[0]}.{version[1]} and {venv} is not a {PYTHON[0]}.{PYTHON[1]}: run `make "
        "setup` (scripts/find_python312.sh finds a Python 3.12), then .venv/bin/python "
        "scripts/h200_first_contact.py ...")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
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
    r.add_argument("--deadline-s", type=float, default=DEADLINE_S)
    r.add_argument("--phases", default=",".join(p.name for p in PHASES),
                   help="comma-separated: rerun a failed phase alone (e.g. --phases slice)")
    r.add_argument("--config", default=str(REPO / "configs" / "config_GB200_128x4x144xtp4pp8cp2.toml"))
    r.add_argument("--no-install", action="store_true",
                   help="use the packages this Python has (a machine that has megatron-core)")
    m = sub.add_parser("merge", help="collect device runs' folders into one and merge them")
    m.add_argument("dest", help="folder the runs' files are copied into (nothing overwritten)")
    m.add_argument("sources", nargs="*", help="the runs' folders, in the order they ran")
    a = ap.parse_args(argv)
    if a.cmd in ("gather", "check"):
        py = python_for_wheels()
        if py is not None:
            print(f"this is Python {sys.version.split()[0]}; gather and check need "
                  f"{PYTHON[0]}.{PYTHON[1]}: re-running with {py}", file=sys.stderr, flush=True)
            os.execv(py, [py, str(Path(__file__).resolve()), *argv])
    if a.cmd == "gather":
        return gather(Path(a.dest))
    if a.cmd == "check":
        return check(Path(a.wheels), run_cpu=not a.imports_only)
    if a.cmd == "merge":
        return outputs.merge_folders(Path(a.dest), [Path(s) for s in a.sources],
                                     [p.name for p in PHASES])
    return run(Path(a.out), Path(a.wheels), a.deadline_s, a.config, install=not a.no_install,
               phases=[p.strip() for p in a.phases.split(",") if p.strip()])


if __name__ == "__main__":
    sys.exit(main())
