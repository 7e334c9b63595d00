# Two commands on a fresh machine: `make demo` and `make test`. Both install into .venv first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# pytest workers for `make test`: CI has 2 cores; one worker owns the Slurm tests, which mostly
# wait on jobs and KillWait, so a third keeps both cores busy meanwhile. Override: `make test JOBS=2`
JOBS ?= 3
FAST_JOBS ?= 2

.PHONY: setup demo test test-fast test-stress check-configs clean-venv

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

# everything but the stress repeats: the Slurm tests on one worker (--dist loadgroup), work handed
# out in the order tests/conftest_schedule.py gives (--no-loadscope-reorder)
test: $(STAMP)
	$(PY) -m pytest -q -n $(JOBS) --dist loadgroup --no-loadscope-reorder -m "not stress" --durations=20

# unit tests only: no training, no multi-process run, no Slurm
test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(FAST_JOBS) -m "not slow and not slurm"

# the fault loops repeated (10 scancels per phase): fails, too, when no test is marked stress
# (pytest's exit status 5)
test-stress: $(STAMP)
	@$(PY) -m pytest -q -n $(FAST_JOBS) --dist loadgroup -m stress --durations=5 || { rc=$$?; \
	  [ $$rc != 5 ] || echo "make test-stress: no test is marked stress" >&2; exit $$rc; }

check-configs: $(STAMP)
	$(PY) -m llama31_405b config check configs/*.toml

clean-venv:
	rm -rf $(VENV)
