"""Padded vs padding-free fine-tuning benchmark: the paper's comparison (arXiv 2407.09105, Table 2) on any machine.

The paper trains the same examples, in the same mini-batches, for the same number of optimizer steps, once with
padded batches and once with padding-free ones (examples concatenated, ``position_ids`` restarting per example,
flash attention), and reports tokens/s, peak memory and validation loss. This module does the same with a
randomly initialised Llama built from a config (nothing is downloaded) on synthetic data whose lengths follow
the two datasets of the paper:

- ``flan``: FLAN-like, lognormal lengths (median ~340 tokens, sigma 0.8, mean ~470): short, heavy right tail;
- ``orcamath``: OrcaMath-like, normal lengths (400 +- 140 tokens): longer, narrower.

Every example is ``<bos> prompt <response template> completion <eos>`` with the template (3 reserved token ids)
at ~70% of the example; token ids are Zipf-distributed, so the loss falls visibly in a few steps. The batches go
through the project's collator (:class:`~trl_padfree.DataCollatorForCompletionOnlyLM`, token-id template, so the
completion-only labels are identical in the padded and the packed layout), then ``model(**batch).loss`` (the
token-weighted mean over completion tokens), ``backward()`` and ``AdamW.step()``.

Variants (each one in a fresh worker process, so that peak memory is its own; by default the workers of a dataset
are trained in lockstep, step i of every variant before step i+1, so that load drift on a shared machine hits them
alike; ``--schedule sequential`` runs them one after the other):

- ``padded-sdpa``: padded batches, ``attn_implementation="sdpa"`` (the baseline);
- ``packed-sdpa``: padding-free batches, transformers' own ``sdpa`` (a dense block-diagonal mask);
- ``packed-padfree``: padding-free batches, this project's ``"padfree"`` attention (varlen, no mask);
- ``packed-fa2``: padding-free batches, ``flash_attention_2`` (only with CUDA and flash-attn installed);
- ``trl-native``: what a TRL 1.x user picks instead: the same examples as prompt/completion records through
  ``trl.SFTTrainer`` with ``SFTConfig(padding_free=True)``, TRL's own collator and the model's default attention;
- ``sft-padfree``: the same records through ``trl.SFTTrainer`` with this project's collator and ``"padfree"``;
- ``token-budget``: padding-free + ``"padfree"`` with mini-batches of whole examples up to a token budget
  (``--max-tokens``, default the fixed batches' mean real tokens) over the same examples: another step count.

Both SFTTrainer variants see the same mini-batches in the same order as the others (verified: every batch the
model receives is fingerprinted), the same initial weights and the same AdamW (constant lr, no clipping); their
step time is the whole trainer loop (dataloader and collation, forward, backward, grad norm, optimizer, logging
every step), so the trainer's per-step overhead shows next to the compute. After training, the attention that
really ran is read from the model and the packing probe is run with the variant's collator.

Recorded per variant: real (non-padding) tokens/s over the timed steps (warm-up steps are trained but not timed;
CUDA steps end with ``torch.cuda.synchronize()``), peak memory (CUDA: ``torch.cuda.max_memory_allocated``; CPU:
peak RSS of the worker process), the train loss of every step, the final eval loss (token-weighted over the eval
set), the number of optimizer steps and the median wall time per step (and its part outside forward, backward
and optimizer), and what each step's batch computed (:mod:`.flops`: matmul FLOPs counted from the batch the model
received), from which each variant's FLOP ratio over padded is printed next to its measured ratio. Results go to
``<output-dir>/<name>.json``, ``.md`` and ``.png``. Targets are judged only where they apply (else "n/a"): the
throughput targets ask for 90% of the workload's FLOP ratio; the command exits 1 when a judged target fails, 2 on
bad options.

    trl-padfree bench                                   # CPU defaults (a few minutes on 2 cores)
    python scripts/bench.py --datasets flan --steps 20
    python scripts/bench.py --device cuda --dtype bfloat16 --model-size 0.5b

This is ``--task sft``; ``--task dpo|grpo|rloo|reward|kto`` runs the other trainers' benchmarks, each with its own
options (``trl-padfree bench --task dpo --help``). The benchmark is this directory of a source checkout, not part of
the installed package.
"""

from __future__ import annotations

from .cli import build_parser, config_from_args, main
from .config import MODEL_PRESETS, VARIANTS, BenchConfig
from .data import DATASETS, TEMPLATE_IDS, make_examples
from .report import compare, evaluate_targets, to_markdown
from .runner import run_benchmark

__all__ = ["DATASETS", "MODEL_PRESETS", "TEMPLATE_IDS", "VARIANTS", "BenchConfig", "build_parser", "compare",
           "config_from_args", "evaluate_targets", "main", "make_examples", "run_benchmark", "to_markdown"]
