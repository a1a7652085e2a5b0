# Set-up and everyday commands. Everything runs inside a local virtual environment (.venv).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# torch. On a machine without an NVIDIA GPU (no nvidia-smi): the CPU build from PyTorch's CPU wheel index
# TORCH_CPU_INDEX (~200 MB, instead of the CUDA build and its gigabytes of nvidia-* packages that the default index
# gives). Where that install fails (the index does not answer within 5 s: an offline mirror, a CI sandbox), pip
# installs TORCH_SPEC from its configured sources instead (a local CPU wheel where there is one). On GPU machines:
# pip's default (CUDA) build. Override either: make install TORCH_CPU_INDEX= (no CPU index), TORCH_SPEC="torch==2.12.*".
HAS_NVIDIA      := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo yes)
TORCH_SPEC      ?= $(if $(HAS_NVIDIA),torch>=2.6,torch==2.13.0)
TORCH_CPU_INDEX ?= $(if $(HAS_NVIDIA),,https://download.pytorch.org/whl/cpu)

.PHONY: install demo test lint bench clean real-tokenizers

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@[ -n "$(TORCH_CPU_INDEX)" ] \
		&& $(PY) -m pip install --quiet --timeout 5 --retries 0 --index-url "$(TORCH_CPU_INDEX)" "$(TORCH_SPEC)" \
		|| { [ -z "$(TORCH_CPU_INDEX)" ] || echo "torch: $(TORCH_CPU_INDEX) failed; installing from pip's sources"; \
		     $(PY) -m pip install --quiet "$(TORCH_SPEC)"; }
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/trl-padfree train --config configs/demo.yaml

# Real tokenizers of 15 model families for the tests, built from the vocabulary files in llama-cpp-python's source
# archive (downloaded with pip; scripts/real_tokenizers.py), cached and git-ignored; rebuilt when the script changes.
REAL_TOKENIZERS := .cache/real-tokenizers
$(REAL_TOKENIZERS)/manifest.json: scripts/real_tokenizers.py | $(VENV)/.installed
	$(PY) scripts/real_tokenizers.py --force --out $(REAL_TOKENIZERS)

real-tokenizers: $(REAL_TOKENIZERS)/manifest.json

# HF_HUB_OFFLINE: the tests never need the network; a test that tried would fail fast instead of hanging.
test: install $(REAL_TOKENIZERS)/manifest.json
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q
	$(VENV)/bin/ruff check trl_padfree tests scripts examples

lint: install
	$(VENV)/bin/ruff check trl_padfree tests scripts examples

bench: install
	$(PY) scripts/bench.py

clean:
	rm -rf $(VENV) outputs bench-results
