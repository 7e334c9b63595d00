# Two commands on a fresh machine: `make demo` and `make test`. Both install into .venv first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# pytest workers for `make test`: CI has 2 cores; one worker owns the Slurm tests, which mostly
# wait on jobs and KillWait, so a third keeps both cores busy meanwhile. Override: `make test JOBS=2`
JOBS ?= 3
FAST_JOBS ?= 2
# extra pytest arguments for `make test` / `make test-stress`, e.g. what each test costs in CPU:
# `make test ARGS="--cpu-times=/tmp/cpu.jsonl"` (with `=`: pytest reads a path given apart before it knows the option), then `.venv/bin/python bench/test_cpu_times.py /tmp/cpu.jsonl`
ARGS ?=

.PHONY: setup demo test test-fast test-stress typecheck coverage check-configs clean-venv

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

# everything but the long runs (`make test-stress`): the Slurm tests on one worker (--dist
# loadgroup), work handed out in the order tests/conftest_schedule.py gives (--no-loadscope-reorder)
test: $(STAMP)
	$(PY) -m pytest -q -n $(JOBS) --dist loadgroup --no-loadscope-reorder \
	  -m "not stress and not converge" --durations=20 $(ARGS)

# unit tests only: no training, no multi-process run, no Slurm
test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(FAST_JOBS) -m "not slow and not slurm"

# the long runs: the runs trained to the tiny target (marked converge: the three tiny runs and
# the tests that read them, the NVFP4 run, the converging Slurm job) and the fault loops repeated
# (marked stress: 10 scancels per phase, the planner sweep); the same workers and order as `make
# test`. Fails, too, when no test is selected (pytest's exit status 5)
test-stress: $(STAMP)
	@$(PY) -m pytest -q -n $(JOBS) --dist loadgroup --no-loadscope-reorder \
	  -m "stress or converge" --durations=10 $(ARGS) || { rc=$$?; \
	  [ $$rc != 5 ] || echo "make test-stress: no test is marked stress or converge" >&2; exit $$rc; }

# mypy (mypy.ini) over the package against the pinned Transformer Engine and megatron-core
# sources, then the seeded faults (SEEDS) it must report at their file and line (scripts/typecheck.py,
# docs/typecheck.md). The first run fetches TE's Python sources into .cache/te-2.20.2/
typecheck: $(STAMP)
	$(PY) scripts/typecheck.py

# `make test` then `make test-stress` (the same selections, workers and order) under coverage.py,
# every Python process they start measured (pyproject.toml [tool.coverage.*]: pytest and its
# workers, the CLI subprocesses, torchrun's ranks, the Slurm job steps), combined into one report
# of the lines of llama31_405b/ that no test executes: .coverage-out/report.txt and html/. Then
# the never-executed blocks that docs/coverage.md does not list (scripts/coverage_inventory.py;
# `--write` refreshes the snapshot the inventory test reads). Fails when either run fails
COV_OUT := $(CURDIR)/.coverage-out
coverage: $(STAMP)
	@rm -rf $(COV_OUT) && mkdir -p $(COV_OUT)/data
	@$(PY) scripts/coverage_inventory.py --record-sources $(COV_OUT)/sources.json
	@start=$$(date +%s); \
	  export COVERAGE_PROCESS_START=$(CURDIR)/pyproject.toml COVERAGE_FILE=$(COV_OUT)/data/.coverage; \
	  $(MAKE) --no-print-directory test; rc1=$$?; \
	  $(MAKE) --no-print-directory test-stress; rc2=$$?; \
	  unset COVERAGE_PROCESS_START COVERAGE_FILE; \
	  echo "make coverage: make test exited $$rc1, make test-stress $$rc2;" \
	    "$$(( $$(date +%s) - start )) s of wall time" | tee $(COV_OUT)/status.txt; \
	  $(PY) -m coverage combine --rcfile=pyproject.toml --data-file=$(COV_OUT)/.coverage -q \
	    $(COV_OUT)/data || exit 1; \
	  $(PY) -m coverage report --rcfile=pyproject.toml --data-file=$(COV_OUT)/.coverage \
	    > $(COV_OUT)/report.txt; tail -n 1 $(COV_OUT)/report.txt; \
	  $(PY) -m coverage html --rcfile=pyproject.toml --data-file=$(COV_OUT)/.coverage -q; \
	  $(PY) scripts/coverage_inventory.py --strict --data $(COV_OUT)/.coverage || exit 1; \
	  [ $$rc1 = 0 ] && [ $$rc2 = 0 ]

check-configs: $(STAMP)
	$(PY) -m llama31_405b config check configs/*.toml

clean-venv:
	rm -rf $(VENV)
