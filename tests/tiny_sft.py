"""Test-only helpers: a tiny SFT setup (tokenizer, tokenized dataset, model, trainer) trained through the real
``SFTTrainer`` on CPU in fp32, and a trainer that records what the Trainer passes to ``compute_loss``."""

from __future__ import annotations

import random
from typing import Any

import torch
from datasets import Dataset
from trl import SFTConfig

from trl_padfree import DataCollatorForCompletionOnlyLM, SFTTrainer
from trl_padfree.testing import tiny_byte_level_tokenizer, tiny_llama

WORDS = "what is the sum of and why does a cat sit on mat please answer reverse these words yes no paris".split()


def tokenized_dataset(tokenizer: Any, n: int, seed: int = 0) -> Dataset:
    """``n`` question/answer examples of varied lengths (about 10-60 tokens), tokenized with EOS."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 24)))
        a = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14)))
        ids = tokenizer(f"### Question: {q}?\n### Answer: {a}.", add_special_tokens=False)["input_ids"]
        rows.append({"input_ids": ids + [tokenizer.eos_token_id]})
    return Dataset.from_list(rows)


class RecordingTrainer(SFTTrainer):
    """Records ``num_items_in_batch`` and the trained tokens of every micro-batch that reaches ``compute_loss``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_items: list[int] = []
        self.trained_tokens: list[int] = []
        self.batch_ids: list[list[list[int]]] = []  # per micro-batch: the token ids of each example

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self.num_items.append(int(num_items_in_batch))
            self.trained_tokens.append(int(inputs["labels"].ne(-100).sum()))
            self.batch_ids.append(examples_of(inputs))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def examples_of(inputs: dict[str, Any]) -> list[list[int]]:
    """The examples' token ids of a padded or flattened batch."""
    ids = inputs["input_ids"]
    if "cu_seq_lens_q" in inputs:
        cu = inputs["cu_seq_lens_q"].tolist()
        row = ids.reshape(-1).tolist()
        return [row[a:b] for a, b in zip(cu[:-1], cu[1:], strict=True)]
    mask = inputs["attention_mask"]
    return [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]


def make_trainer(
    padding_free: bool,
    dataset: Dataset,
    tokenizer: Any,
    output_dir: str,
    *,
    model_seed: int = 0,
    model: Any = None,
    check_packing: bool = False,
    **config: Any,
) -> RecordingTrainer:
    """A ``RecordingTrainer`` on ``model`` or a tiny Llama (``padfree`` if padding-free, else sdpa)."""
    if model is None:
        model = tiny_llama(vocab_size=len(tokenizer), seed=model_seed,
                           attn_implementation="padfree" if padding_free else "sdpa")
    max_tokens = config.pop("max_tokens_per_batch", None)
    trainer_kwargs = {k: config.pop(k) for k in ("scored_lm_head",) if k in config}
    defaults = dict(
        output_dir=output_dir, per_device_train_batch_size=4, gradient_accumulation_steps=1, max_steps=3,
        learning_rate=3e-3, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, bf16=False, seed=0, padding_free=False,
        max_length=256, dataset_kwargs={"skip_prepare_dataset": True}, disable_tqdm=True,
        dataloader_pin_memory=False, gradient_checkpointing=None, activation_checkpointing=False,
    )  # fmt: skip
    defaults.update(config)
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tokenizer, padding_free=padding_free)
    return RecordingTrainer(
        model=model, args=SFTConfig(**defaults), train_dataset=dataset, processing_class=tokenizer,
        data_collator=collator, check_packing=check_packing, max_tokens_per_batch=max_tokens, **trainer_kwargs,
    )  # fmt: skip


def tokenizer() -> Any:
    return tiny_byte_level_tokenizer()


def losses(trainer: Any) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest ``|a - b| / |b|`` (norms) over the tensors of two state dicts."""
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-12)) for k in a)


def weights(trainer: Any) -> dict[str, torch.Tensor]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {k: v.detach().clone().float() for k, v in model.state_dict().items()}
