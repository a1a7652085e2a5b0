"""``trl-padfree bench``: padded vs padding-free training, one task per trainer (``--task sft|dpo|grpo|rloo|reward|kto``),
and SFT of a hybrid (gated delta rule + attention) model (``--task hybrid``).

One command line (:mod:`.cli`), one preset (:mod:`.preset`), one way to run the variants (:mod:`.runner`), one
report path (:mod:`.report`) and the targets as data (:mod:`.targets`); what differs per task (its data, its model
and trainer set-up, its measures) is in its own modules: :mod:`.sft` (:mod:`.config`, :mod:`.data`, :mod:`.sft_run`,
:mod:`.sft_report`), :mod:`.dpo` (:mod:`.dpo_data`, :mod:`.dpo_report`), :mod:`.rl`, :mod:`.reward` and
:mod:`.hybrid`. The benchmark is this directory of a source checkout, not part of the installed package.
"""

from __future__ import annotations

from .cli import build_parser, main
from .config import MODEL_PRESETS, VARIANTS, BenchConfig
from .data import DATASETS, TEMPLATE_IDS, make_examples
from .sft import config_from_args, run_benchmark
from .sft_report import compare, evaluate_targets, to_markdown

__all__ = ["DATASETS", "MODEL_PRESETS", "TEMPLATE_IDS", "VARIANTS", "BenchConfig", "build_parser", "compare",
           "config_from_args", "evaluate_targets", "main", "make_examples", "run_benchmark", "to_markdown"]
