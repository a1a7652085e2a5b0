"""Shared set-up of the DPO tests: a tiny tokenizer and Llama, preference pairs of uneven lengths, and trainers
for the three layouts (TRL's padded batch, this package's padding-free row, prompt-once)."""

from __future__ import annotations

import random
from typing import Any

import torch
from datasets import Dataset
from trl import DPOConfig

from trl_padfree import DPOTrainer
from trl_padfree.testing import demo_corpus, tiny_byte_level_tokenizer, tiny_llama

LAYOUTS = ("padded", "padfree", "once")


def tokenizer() -> Any:
    tok = tiny_byte_level_tokenizer()
    tok.pad_token = tok.eos_token
    return tok


def pairs(n: int = 24, seed: int = 0) -> Dataset:
    """Plain-text (prompt, chosen, rejected) triples with independently drawn, uneven lengths."""
    rng = random.Random(seed)
    corpus = demo_corpus(200, seed)

    def text(k: int) -> str:
        return " ".join(rng.choice(corpus) for _ in range(k))

    rows = [{"prompt": "Q: " + text(rng.randint(1, 3)) + "\nA:", "chosen": " " + text(rng.randint(1, 3)),
             "rejected": " " + text(rng.randint(1, 2))} for _ in range(n)]
    return Dataset.from_list(rows)


def model(layout: str, seed: int = 0, **overrides: Any) -> Any:
    attn = "sdpa" if layout == "padded" else "padfree"
    return tiny_llama(seed=seed, attn_implementation=overrides.pop("attn_implementation", attn), **overrides)


def config(layout: str, out: str, **overrides: Any) -> DPOConfig:
    kwargs: dict[str, Any] = dict(
        output_dir=out, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=3,
        learning_rate=1e-3, logging_steps=1, report_to="none", save_strategy="no", bf16=False,
        use_cpu=True, seed=0, disable_dropout=True, dataloader_num_workers=0, max_length=None,
        padding_free=layout != "padded", activation_checkpointing=False, gradient_checkpointing=False,
    )
    kwargs.update(overrides)
    return DPOConfig(**kwargs)


def trainer(layout: str, data: Dataset, tok: Any, out: str, *, ref: bool = True, peft: Any = None,
            model_kwargs: dict | None = None, check_packing: bool = True, **overrides: Any) -> DPOTrainer:
    policy = model(layout, **(model_kwargs or {}))
    ref_model = model(layout, seed=1, **(model_kwargs or {})) if ref else None
    return DPOTrainer(policy, ref_model, args=config(layout, out, **overrides), train_dataset=data,
                      processing_class=tok, peft_config=peft, prompt_once=layout == "once",
                      check_packing=check_packing)


def step_logs(t: DPOTrainer) -> list[dict[str, float]]:
    return [e for e in t.state.log_history if "loss" in e]


def weights(t: DPOTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in t.model.named_parameters()}


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)).item() for k in b)
