#!/usr/bin/env python
"""Padded vs padding-free training benchmark: the same as ``trl-padfree bench`` (see ``benchmarks/``).

    python scripts/bench.py                                            # CPU defaults, a few minutes on 2 cores
    python scripts/bench.py --datasets flan --steps 20 --repeats 3
    python scripts/bench.py --variants padded-sdpa,packed-padfree,trl-native,sft-padfree,token-budget --threads 1
    python scripts/bench.py --device cuda --dtype bfloat16 --model-size 0.5b
    python scripts/bench.py --task grpo --steps 6 --scale 0.25
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is not installed: the checkout's

from benchmarks.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
