#!/usr/bin/env python
"""``trl-padfree train`` for ``python`` and ``accelerate launch`` / ``torchrun``.

    python scripts/train.py --config configs/demo.yaml [--field value ...]
    accelerate launch --config_file configs/accelerate/ddp.yaml scripts/train.py --config configs/NAME.yaml
"""

import sys
from pathlib import Path

try:
    from trl_padfree.launch import main
except ImportError:  # a source checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from trl_padfree.launch import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
