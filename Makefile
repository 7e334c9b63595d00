# Two commands on a fresh machine: `make demo` and `make test`. Both install into .venv first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# pytest workers: CI has 2 cores; override with `make test JOBS=1`
JOBS ?= 2

.PHONY: setup demo test test-fast check-configs clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml constraints/cpu.txt scripts/find_python312.sh
	@py=$$(scripts/find_python312.sh) && echo "using $$py" && \
	  { [ -x $(PY) ] || $$py -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints/cpu.txt -e '.[dev]'
	@$(PY) -c "import torch, megatron.core, mlperf_logging; from importlib.metadata import version as v; print('torch', torch.__version__, '| megatron-core', v('megatron-core'), '| mlperf-logging', v('mlperf-logging'))"
	@touch $@

demo: $(STAMP)
	$(PY) -m llama31_405b demo

test: $(STAMP)
	$(PY) -m pytest -q -n $(JOBS) --dist loadgroup --durations=15

test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(JOBS) -m "not slow and not slurm"

check-configs: $(STAMP)
	$(PY) -m llama31_405b config check configs/*.toml

clean-venv:
	rm -rf $(VENV)
