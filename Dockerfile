# The training image: NGC PyTorch (CUDA, cuDNN, NCCL, torch and Transformer Engine built by
# NVIDIA for Blackwell) plus this project with its `gpu` extra and mlperf-logging.
#
#   docker build -t llama31_405b:latest .
#   enroot import -o llama31_405b.sqsh dockerd://llama31_405b:latest
#   CONT=$PWD/llama31_405b.sqsh DATADIR=... CKPTDIR=... LOGDIR=... CONFIG=configs/<file> \
#     sbatch -N <nodes> run_and_time.sh
#
# Mount points (run_and_time.sh mounts them through pyxis when CONT is set):
#   /data   DATADIR: C4 indexed datasets (.bin/.idx) and tokenizer/    (data.data_dir)
#   /ckpt   CKPTDIR: the initial Megatron distributed checkpoint       (checkpoint.ckpt_dir)
#   /logs   LOGDIR:  result_<i>.txt and the checker's reports
#
# The image's torch (and NCCL, cuDNN, ...) must stay as NVIDIA built them: every package the base
# image ships is pinned in a constraints file before the project is installed, so pip can only add
# what is missing (megatron-core, mlperf-logging, ...) and fails loudly instead of replacing torch.
# The build checks at the end that torch is unchanged, that Transformer Engine is a TE_SERIES
# release and that Apex's fused_weight_gradient_mlp_cuda imports.

# NGC PyTorch 26.10: Ubuntu 24.04, Python 3.12, CUDA 13, Transformer Engine 2.x.
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:26.10-py3
FROM ${BASE_IMAGE}

# Transformer Engine release series the project is verified against (pyproject.toml's gpu extra
# pins the same): the image's TE is kept when it belongs to it, replaced otherwise.
ARG TE_SERIES=2.20
# Apex source of fused_weight_gradient_mlp_cuda, built only when the base image lacks the module
# (scripts/build_apex_wgrad.py): a fixed release tag of NVIDIA's Apex repository.
ARG APEX_REPO=https://github.com/NVIDIA/apex.git
ARG APEX_REF=24.04.01

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /workspace/llama31_405b

# Pin what the image ships; remember torch's exact build.
RUN python -m pip list --format=freeze | grep -E '^[A-Za-z0-9_.-]+==' > /opt/image-constraints.txt \
 && grep -qiE '^torch==' /opt/image-constraints.txt \
 && python -c 'import torch; print(torch.__version__)' > /opt/image-torch-version.txt

# Apex's fused_weight_gradient_mlp_cuda (Megatron's gradient-accumulation fusion, on in the GB200
# configs, needs it): the image's when it has one, else built from APEX_REF against the image's
# torch. Before the project's files, so a code change does not rebuild it.
COPY scripts/build_apex_wgrad.py /opt/build_apex_wgrad.py
RUN if python -c 'import fused_weight_gradient_mlp_cuda' 2>/dev/null; then \
      echo "the base image provides Apex's fused_weight_gradient_mlp_cuda"; \
    else \
      echo "building Apex's fused_weight_gradient_mlp_cuda from ${APEX_REPO} at ${APEX_REF}" \
      && git clone --quiet --filter=blob:none "${APEX_REPO}" /opt/apex-src \
      && git -C /opt/apex-src -c advice.detachedHead=false checkout "${APEX_REF}" \
      && python /opt/build_apex_wgrad.py /opt/apex-src /opt/apex-wheel \
      && python -m pip install --no-cache-dir --no-deps /opt/apex-wheel/*.whl \
      && rm -rf /opt/apex-src /opt/apex-wheel; \
    fi \
 && python -c 'import fused_weight_gradient_mlp_cuda as m; assert hasattr(m, "wgrad_gemm_accum_fp32")' \
 && test "$(python -c 'import torch; print(torch.__version__)')" = "$(cat /opt/image-torch-version.txt)"

COPY . .

# The project with megatron-core and mlperf-logging (pinned in pyproject.toml). Transformer Engine:
# NGC builds it into the image as one distribution with its torch extension; asking pip for the
# `gpu` extra (transformer-engine[pytorch]) there would make it fetch and compile a second
# transformer_engine_torch from PyPI. So the image's TE is kept when it is a TE_SERIES release; a
# base image without TE, or with another series, gets the gpu extra (the image's TE removed and
# unpinned first). Then prove torch was not replaced and TE is the series required.
RUN te_version=$(python -c 'import importlib.metadata as m; print(m.version("transformer_engine"))' 2>/dev/null || true) \
 && extra="" \
 && case "${te_version}" in \
      "${TE_SERIES}".*) echo "keeping the image's Transformer Engine ${te_version}" ;; \
      "") extra="[gpu]"; echo "no Transformer Engine in the image: installing the gpu extra" ;; \
      *) extra="[gpu]"; echo "the image's Transformer Engine ${te_version} is not ${TE_SERIES}.x: replacing it" \
         && python -m pip uninstall -y transformer_engine transformer_engine_torch transformer_engine_cu12 transformer_engine_cu13 \
         && sed -i -E '/^transformer[-_]engine/Id' /opt/image-constraints.txt ;; \
    esac \
 && python -m pip install --no-cache-dir -c /opt/image-constraints.txt ".${extra}" \
 && test "$(python -c 'import torch; print(torch.__version__)')" = "$(cat /opt/image-torch-version.txt)" \
 && python -c 'import importlib.metadata as m, sys; v = m.version("transformer_engine"); sys.exit(None if v.startswith(sys.argv[1] + ".") else f"Transformer Engine {v} is installed; {sys.argv[1]}.x is required")' "${TE_SERIES}" \
 && python -c 'import megatron.core, mlperf_logging, transformer_engine.pytorch, llama31_405b; from transformer_engine.common.recipe import NVFP4BlockScaling' \
 && python -c 'import fused_weight_gradient_mlp_cuda' \
 && python -m llama31_405b config check configs/*.toml \
 && mkdir -p /data /ckpt /logs

LABEL org.opencontainers.image.title="llama31_405b MLPerf Training reference" \
      org.opencontainers.image.description="Llama 3.1 405B pretraining (NVFP4, GB200 NVL72); mounts: /data datasets, /ckpt checkpoints, /logs results"
