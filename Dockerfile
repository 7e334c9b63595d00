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

# The project with its gpu extra (Transformer Engine, resolved against the image's own build),
# megatron-core and mlperf-logging; then prove torch was not replaced.
RUN python -m pip install --no-cache-dir -c /opt/image-constraints.txt ".[gpu]" \
 && test "$(python -c 'import torch; print(torch.__version__)')" = "$(cat /opt/image-torch-version.txt)" \
 && python -c 'import megatron.core, mlperf_logging, transformer_engine.pytorch, llama31_405b' \
 && python -m llama31_405b config check configs/*.toml \
 && mkdir -p /data /ckpt /logs

LABEL org.opencontainers.image.title="llama31_405b MLPerf Training reference" \
      org.opencontainers.image.description="Llama 3.1 405B pretraining (NVFP4, GB200 NVL72); mounts: /data datasets, /ckpt checkpoints, /logs results"
