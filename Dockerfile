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
# The image's torch (and Transformer Engine, NCCL, ...) must stay as NVIDIA built them: every
# package the base image ships is pinned in a constraints file before the project is installed,
# so pip can only add what is missing (megatron-core, mlperf-logging, ...) and fails loudly
# instead of replacing torch. The build ends by checking that torch is unchanged.

# NGC PyTorch 26.10: Ubuntu 24.04, Python 3.12, CUDA 13, Transformer Engine 2.x.
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:26.10-py3
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /workspace/llama31_405b

# Pin what the image ships; remember torch's exact build.
RUN python -m pip list --format=freeze | grep -E '^[A-Za-z0-9_.-]+==' > /opt/image-constraints.txt \
 && grep -qiE '^torch==' /opt/image-constraints.txt \
 && python -c 'import torch; print(torch.__version__)' > /opt/image-torch-version.txt

COPY . .

# The project with megatron-core and mlperf-logging (pinned in pyproject.toml). Transformer Engine:
# NGC builds it into the image as one distribution with its torch extension; asking pip for the
# `gpu` extra (transformer-engine[pytorch]) there would make it fetch and compile a second
# transformer_engine_torch from PyPI. So the extra is installed only when the base image has no
# Transformer Engine (another --build-arg BASE_IMAGE). Then prove torch was not replaced.
RUN extra="[gpu]" \
 && if python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("transformer_engine") is None)'; then extra=""; fi \
 && echo "installing .${extra} (the image's Transformer Engine is kept when it has one)" \
 && python -m pip install --no-cache-dir -c /opt/image-constraints.txt ".${extra}" \
 && test "$(python -c 'import torch; print(torch.__version__)')" = "$(cat /opt/image-torch-version.txt)" \
 && python -c 'import megatron.core, mlperf_logging, transformer_engine.pytorch, llama31_405b; from transformer_engine.common.recipe import NVFP4BlockScaling' \
 && python -m llama31_405b config check configs/*.toml \
 && mkdir -p /data /ckpt /logs

LABEL org.opencontainers.image.title="llama31_405b MLPerf Training reference" \
      org.opencontainers.image.description="Llama 3.1 405B pretraining (NVFP4, GB200 NVL72); mounts: /data datasets, /ckpt checkpoints, /logs results"
