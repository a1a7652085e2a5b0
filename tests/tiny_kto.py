"""Shared set-up of the KTO tests: a tiny Llama, unpaired uneven examples (more desirable than undesirable), and
trainers of tests/layout_runs.py's layouts."""

from __future__ import annotations

from typing import Any

import torch
from datasets import Dataset
from layout_runs import model, random_text, same_preference_step, training_args

from trl_padfree import KTOConfig, KTOTrainer
from trl_padfree.testing import tiny_byte_level_tokenizer


def tokenizer() -> Any:
    return tiny_byte_level_tokenizer()


def examples(n: int = 24, seed: int = 0) -> Dataset:
    """Plain-text (prompt, completion, label) rows; about 60% desirable."""
    rng, text = random_text(seed)
    rows = [{"prompt": "Q: " + text(rng.randint(1, 3)) + "\nA:", "completion": " " + text(rng.randint(1, 3)),
             "label": rng.random() < 0.6} for _ in range(n)]
    return Dataset.from_list(rows)


def config(layout: str, out: str, **overrides: Any) -> KTOConfig:
    own = {"learning_rate": 1e-3, "desirable_weight": 1.3, "undesirable_weight": 0.7}
    return KTOConfig(**training_args(layout, out, **own | overrides))


def trainer(layout: str, data: Dataset, tok: Any, out: str, *, ref: bool = True, peft: Any = None,
            model_kwargs: dict | None = None, check_packing: bool = True, scored_lm_head: bool | None = None,
            eval_dataset: Dataset | None = None, **overrides: Any) -> KTOTrainer:
    policy = model(layout, **(model_kwargs or {}))
    ref_model = None
    if ref:
        ref_model = model(layout, seed=1, **(model_kwargs or {}))
        with torch.no_grad():  # a sharper reference: lower log-probs on the mismatched KL sequences, so KL > 0
            ref_model.lm_head.weight.mul_(4.0)
    return KTOTrainer(policy, ref_model, args=config(layout, out, **overrides), train_dataset=data,
                      eval_dataset=eval_dataset, processing_class=tok, peft_config=peft, prompt_once=layout == "once",
                      check_packing=check_packing,
                      **({} if scored_lm_head is None else {"scored_lm_head": scored_lm_head}))


METRICS = ("loss", "kl", "logps/chosen", "logps/rejected", "rewards/chosen", "rewards/rejected", "rewards/margins",
           "entropy", "logits/chosen", "logits/rejected", "num_tokens")


def same_step(layout: str, got: dict[str, float], want: dict[str, float], metrics: tuple[str, ...] = METRICS) -> None:
    """One step's KTO metrics of ``layout`` equal TRL's padded ones (``layout_runs.same_preference_step``)."""
    same_preference_step(layout, got, want, metrics)
