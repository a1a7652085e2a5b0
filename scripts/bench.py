#!/usr/bin/env python
"""The same as ``trl-padfree bench`` (the harness in ``benchmarks/``, docs/benchmark.md).

    python scripts/bench.py                                   # sft, both datasets, CPU
    python scripts/bench.py --task dpo --steps 6
    python scripts/bench.py --device cuda --dtype bfloat16 --model-size 0.5b
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is not installed: the checkout's

from benchmarks.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
