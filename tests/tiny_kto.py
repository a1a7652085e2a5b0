"""Shared set-up of the KTO tests: a tiny tokenizer and Llama, unpaired (prompt, completion, label) examples of
uneven lengths with more desirable than undesirable ones, and trainers for TRL's padded batches and this package's
padding-free rows (without and with the reference's prompt computed once)."""

from __future__ import annotations

import random
from typing import Any

import torch
from datasets import Dataset

from trl_padfree import KTOConfig, KTOTrainer
from trl_padfree.testing import demo_corpus, tiny_byte_level_tokenizer, tiny_llama

LAYOUTS = ("padded", "padfree", "once")


def tokenizer() -> Any:
    return tiny_byte_level_tokenizer()


def examples(n: int = 24, seed: int = 0) -> Dataset:
    """Plain-text (prompt, completion, label) rows; about 60% desirable."""
    rng = random.Random(seed)
    corpus = demo_corpus(200, seed)

    def text(k: int) -> str:
        return " ".join(rng.choice(corpus) for _ in range(k))

    rows = [{"prompt": "Q: " + text(rng.randint(1, 3)) + "\nA:", "completion": " " + text(rng.randint(1, 3)),
             "label": rng.random() < 0.6} for _ in range(n)]
    return Dataset.from_list(rows)


def model(layout: str, seed: int = 0, **overrides: Any) -> Any:
    attn = "sdpa" if layout == "padded" else "padfree"
    return tiny_llama(seed=seed, attn_implementation=overrides.pop("attn_implementation", attn), **overrides)


def config(layout: str, out: str, **overrides: Any) -> KTOConfig:
    kwargs: dict[str, Any] = dict(
        output_dir=out, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=3,
        learning_rate=1e-3, logging_steps=1, report_to="none", save_strategy="no", bf16=False,
        use_cpu=True, seed=0, disable_dropout=True, dataloader_num_workers=0, max_length=None,
        padding_free=layout != "padded", gradient_checkpointing=False, desirable_weight=1.3,
        undesirable_weight=0.7,
    )
    kwargs.update(overrides)
    return KTOConfig(**kwargs)


def trainer(layout: str, data: Dataset, tok: Any, out: str, *, ref: bool = True, peft: Any = None,
            model_kwargs: dict | None = None, check_packing: bool = True, scored_lm_head: bool | None = None,
            **overrides: Any) -> KTOTrainer:
    policy = model(layout, **(model_kwargs or {}))
    ref_model = None
    if ref:
        ref_model = model(layout, seed=1, **(model_kwargs or {}))
        with torch.no_grad():  # a sharper reference: lower log-probs on the mismatched KL sequences, so KL > 0
            ref_model.lm_head.weight.mul_(4.0)
    return KTOTrainer(policy, ref_model, args=config(layout, out, **overrides), train_dataset=data,
                      processing_class=tok, peft_config=peft, prompt_once=layout == "once",
                      check_packing=check_packing,
                      **({} if scored_lm_head is None else {"scored_lm_head": scored_lm_head}))


def step_logs(t: KTOTrainer) -> list[dict[str, float]]:
    return [e for e in t.state.log_history if "loss" in e]


def weights(t: KTOTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in t.model.named_parameters()}


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)).item() for k in b)
