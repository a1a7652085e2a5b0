"""Shared set-up of the reward tests: a tiny sequence-classification Llama, uneven preference pairs, and trainers of
tests/layout_runs.py's layouts."""

from __future__ import annotations

from typing import Any

import torch
from datasets import Dataset
from layout_runs import RTOL, assert_same_metrics, random_text, training_args
from transformers import LlamaForSequenceClassification

from trl_padfree import RewardConfig, RewardTrainer
from trl_padfree.testing import tiny_byte_level_tokenizer, tiny_llama_config


def tokenizer(pad_is_eos: bool = False) -> Any:
    tok = tiny_byte_level_tokenizer()
    if pad_is_eos:  # as for tokenizers without a pad token: every sequence ends with the "pad" (its EOS)
        tok.pad_token = tok.eos_token
    return tok


def pairs(n: int = 24, seed: int = 0, *, explicit_prompt: bool = True, margin: bool = False) -> Dataset:
    """Plain-text preference pairs with independently drawn, uneven lengths; the prompt as a column of its own
    (``explicit_prompt``) or at the start of both texts (implicit)."""
    rng, text = random_text(seed)
    rows = []
    for _ in range(n):
        prompt = "Q: " + text(rng.randint(1, 3)) + "\nA:"
        chosen, rejected = " " + text(rng.randint(1, 3)), " " + text(rng.randint(1, 2))
        row = ({"prompt": prompt, "chosen": chosen, "rejected": rejected} if explicit_prompt
               else {"chosen": prompt + chosen, "rejected": prompt + rejected})
        if margin:
            row["margin"] = round(rng.uniform(-1.0, 2.0), 3)
        rows.append(row)
    return Dataset.from_list(rows)


def model(layout: str, tok: Any, seed: int = 0, attn_implementation: str | None = None) -> Any:
    """A randomly initialised 2-layer Llama (GQA) with a one-output score head, fp32."""
    attn = attn_implementation or ("sdpa" if layout == "padded" else "padfree")
    config = tiny_llama_config(vocab_size=len(tok), num_labels=1, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    return LlamaForSequenceClassification._from_config(config, attn_implementation=attn)


def config(layout: str, out: str, **overrides: Any) -> RewardConfig:
    return RewardConfig(**config_kwargs(layout, out, **overrides))


def config_kwargs(layout: str, out: str, **overrides: Any) -> dict[str, Any]:
    return training_args(layout, out, **{"learning_rate": 1e-2} | overrides)


def trainer(layout: str, data: Dataset, tok: Any, out: str, *, model_kwargs: dict | None = None,
            peft: Any = None, check_packing: bool = True, eval_dataset: Dataset | None = None,
            **overrides: Any) -> RewardTrainer:
    return RewardTrainer(model(layout, tok, **(model_kwargs or {})),
                         args=config(layout, out, **overrides), train_dataset=data, processing_class=tok,
                         eval_dataset=eval_dataset, peft_config=peft, prompt_once=layout == "once",
                         check_packing=check_packing)


# prompt-once gradients: 1.08e-5 in fp32 (Llama's RMSNorm backward in fp32; exact in fp64: tests/test_reward.py's
# test_float64_gradients_on_one_batch)
ONCE_GRAD_RTOL = 2e-5
METRICS = ("loss", "num_tokens", "min_reward", "mean_reward", "max_reward", "accuracy", "margin")


def same_step(layout: str, got: dict[str, float], want: dict[str, float], keys=METRICS, prefix: str = "") -> None:
    """One step's reward metrics of ``layout`` equal TRL's padded ones: margin and mean reward, differences and
    means of rewards, judged against the rewards' size."""
    scale = max(abs(want[prefix + "min_reward"]), abs(want[prefix + "max_reward"]))
    assert_same_metrics(layout, got, want, keys, (prefix + "margin", prefix + "mean_reward"), scale)


def grad_rtol(layout: str) -> float:
    return RTOL if layout == "padfree" else ONCE_GRAD_RTOL
