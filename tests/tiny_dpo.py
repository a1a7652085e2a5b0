"""Shared set-up of the DPO tests: a tiny tokenizer and Llama, preference pairs of uneven lengths, and trainers
for the three layouts of tests/layout_runs.py (TRL's padded batch, this package's padding-free row, prompt-once)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from datasets import Dataset
from layout_runs import model, random_text, same_preference_step, training_args
from trl import DPOConfig

from trl_padfree import DPOTrainer
from trl_padfree.testing import tiny_byte_level_tokenizer


def tokenizer() -> Any:
    tok = tiny_byte_level_tokenizer()
    tok.pad_token = tok.eos_token
    return tok


def pairs(n: int = 24, seed: int = 0) -> Dataset:
    """Plain-text (prompt, chosen, rejected) triples with independently drawn, uneven lengths."""
    rng, text = random_text(seed)
    rows = [{"prompt": "Q: " + text(rng.randint(1, 3)) + "\nA:", "chosen": " " + text(rng.randint(1, 3)),
             "rejected": " " + text(rng.randint(1, 2))} for _ in range(n)]
    return Dataset.from_list(rows)


def config(layout: str, out: str, **overrides: Any) -> DPOConfig:
    own = {"learning_rate": 1e-3, "activation_checkpointing": False}
    return DPOConfig(**training_args(layout, out, **own | overrides))


def trainer(layout: str, data: Dataset, tok: Any, out: str, *, ref: bool = True, peft: Any = None,
            model_kwargs: dict | None = None, check_packing: bool = True, scored_lm_head: bool | None = None,
            make_model: Callable[..., Any] = model, **overrides: Any) -> DPOTrainer:
    """DPO trainer of ``layout``: ``make_model`` policy (seed 0), reference (seed 1, unless not ``ref``)."""
    policy = make_model(layout, **(model_kwargs or {}))
    ref_model = make_model(layout, seed=1, **(model_kwargs or {})) if ref else None
    return DPOTrainer(policy, ref_model, args=config(layout, out, **overrides), train_dataset=data,
                      processing_class=tok, peft_config=peft, prompt_once=layout == "once",
                      check_packing=check_packing,
                      **({} if scored_lm_head is None else {"scored_lm_head": scored_lm_head}))


METRICS = ("loss", "logps/chosen", "logps/rejected", "rewards/chosen", "rewards/rejected", "rewards/margins",
           "entropy", "logits/chosen", "logits/rejected", "mean_token_accuracy", "num_tokens")


def same_step(layout: str, got: dict[str, float], want: dict[str, float]) -> None:
    """One step's DPO metrics of ``layout`` equal TRL's padded ones (``layout_runs.same_preference_step``)."""
    same_preference_step(layout, got, want, METRICS)
