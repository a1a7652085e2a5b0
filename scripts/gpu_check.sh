#!/usr/bin/env bash
# The GPU checks of the "padfree" attention, as one script for a CUDA machine (about 5 minutes on one H200).
#
#   bash scripts/gpu_check.sh [OUTPUT_DIR]        # default: gpu-check/ (or $OUT when set)
#
# 1. env.txt:        GPU, versions, the varlen kernel "padfree" picks for bf16, pick_attn_implementation().
# 2. cuda-tests.txt: the CUDA tests (tests/test_cuda.py: bf16 loss and every gradient of a Llama and a sliding-window
#                    Mistral, padfree vs padded sdpa against an fp32 reference; the kernel and probe CUDA tests).
# 3. cuda.{json,md,png}, bench.txt: `trl-padfree bench` on a 0.49B random-init Llama in bf16, batch 8, 3 warm-up
#                    + 20 timed steps per variant, FLAN-like and OrcaMath-like lengths.
# 4. full-suite.txt: the whole test suite on the GPU machine (it must pass there too).
#
# Each stage has its own time limit, so one that hangs does not cost the others. Needs the project's dependencies
# importable (pip install -e ".[dev]", or PYTHONPATH with the wheels); it runs from the repository root.
set -u
out=${1:-${OUT:-gpu-check}}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    $py - <<'EOF'
import inspect

import torch
import transformers
import trl

import trl_padfree
from trl_padfree.attention_backends import flash_attn_available, select_backend, torch_varlen_available

print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "trl",
      trl.__version__)
print("gpu", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
print("flash-attn available:", flash_attn_available(), "| torch varlen_attn available:", torch_varlen_available())
if torch_varlen_available():
    from torch.nn.attention.varlen import varlen_attn
    print("varlen_attn", inspect.signature(varlen_attn))
print("padfree kernel for bf16:", select_backend("cuda", torch.bfloat16))
print("pick_attn_implementation():", trl_padfree.pick_attn_implementation())
EOF
} 2>&1 | tee "$out/env.txt"

echo "== CUDA tests"
timeout 120 $py -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_attention.py tests/test_probe.py \
    -k cuda 2>&1 | tee "$out/cuda-tests.txt"

echo "== benchmark"
timeout 300 $py scripts/bench.py --device cuda --dtype bfloat16 --model-size 0.5b --warmup 3 --steps 20 \
    --name cuda --output-dir "$out" 2>&1 | tee "$out/bench.txt"

echo "== full test suite"
# About 2 minutes with pytest-xdist on 16 cores (over 2 without it, where the limit below cuts it short).
parallel=""
if $py -c "import xdist" 2>/dev/null; then parallel="-n 8"; fi
timeout 200 $py -m pytest -q -p no:cacheprovider -rfs $parallel 2>&1 | tail -60 | tee "$out/full-suite.txt"
