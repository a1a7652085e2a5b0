# Set-up and everyday commands. Everything runs inside a local virtual environment (.venv).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# A CPU build of torch on machines without an NVIDIA GPU (pip takes it from the local wheel cache
# when present); on GPU machines pip's default torch build.
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo "torch>=2.6" || echo "torch==2.13.0")

.PHONY: install demo test lint bench clean real-tokenizers

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/trl-padfree train --config configs/demo.yaml

# Real tokenizers of 14 model families for tests/test_real_tokenizers.py, built once from the vocabulary files
# in llama-cpp-python's source archive (downloaded with pip; scripts/real_tokenizers.py), cached and git-ignored.
REAL_TOKENIZERS := .cache/real-tokenizers
$(REAL_TOKENIZERS)/manifest.json: | $(VENV)/.installed
	$(PY) scripts/real_tokenizers.py --out $(REAL_TOKENIZERS)

real-tokenizers: $(REAL_TOKENIZERS)/manifest.json

# HF_HUB_OFFLINE: the tests never need the network; a test that tried would fail fast instead of hanging.
test: install $(REAL_TOKENIZERS)/manifest.json
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q
	$(VENV)/bin/ruff check trl_padfree tests scripts

lint: install
	$(VENV)/bin/ruff check trl_padfree tests scripts

bench: install
	$(PY) scripts/bench.py

clean:
	rm -rf $(VENV) outputs bench-results
