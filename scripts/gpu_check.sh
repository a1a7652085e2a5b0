#!/usr/bin/env bash
# The GPU checks, as one script for a CUDA machine (about 5 minutes on one H200), each stage with its own time limit:
#   bash scripts/gpu_check.sh [OUTPUT_DIR]        # default: gpu-check/ (or $OUT when set)
# env.txt (versions, the kernel "padfree" picks for bf16), cuda-tests.txt (the CUDA tests), cuda.{json,md,png} and
# bench.txt (the bench on a 0.49B Llama in bf16), full-suite.txt (the whole suite). Needs `pip install -e ".[dev]"`.
set -u
out=${1:-${OUT:-gpu-check}}
mkdir -p "$out"
cd "$(dirname "$0")/.."
# USE_HUB_KERNELS=NO: transformers 5.25 fetches hub kernels (rotary) for CUDA models, which an offline machine
# cannot (docs/faults.md)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 USE_HUB_KERNELS=NO PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    $py - <<'EOF'
import torch, transformers, trl, trl_padfree
from trl_padfree.attention_backends import flash_attn_available, select_backend, torch_varlen_available
print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "trl",
      trl.__version__, "gpu", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
print("flash-attn:", flash_attn_available(), "| torch varlen_attn:", torch_varlen_available(),
      "| padfree kernel for bf16:", select_backend("cuda", torch.bfloat16),
      "| pick_attn_implementation():", trl_padfree.pick_attn_implementation())
EOF
} 2>&1 | tee "$out/env.txt"

echo "== CUDA tests"
timeout 120 $py -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_attention.py tests/test_probe.py \
    -k cuda 2>&1 | tee "$out/cuda-tests.txt"

echo "== benchmark"
timeout 300 $py scripts/bench.py --device cuda --dtype bfloat16 --model-size 0.5b --datasets flan \
    --warmup 3 --steps 20 --name cuda --output-dir "$out" 2>&1 | tee "$out/bench.txt"

echo "== full test suite"  # about 10 minutes with pytest-xdist on 8 cores: cut at 200 s by SIGINT, so pytest still
# prints the failures it met
parallel=""
if $py -c "import xdist" 2>/dev/null; then parallel="-n 8"; fi
timeout -s INT -k 30 200 $py -m pytest -q -p no:cacheprovider --tb=line -rfs $parallel 2>&1 | tail -60 | tee "$out/full-suite.txt"
