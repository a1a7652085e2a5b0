"""``trl-padfree train``: SFT with :class:`trl_padfree.SFTTrainer` and this package's completion-only collator; the
data tokenized and labelled once by :mod:`.sft_data`, the collator only flattens those labels. The training logs
add ``padding_share`` (``count_padding`` of :class:`trl_padfree.throughput.RealTokensLog`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from trl_padfree.trainer import SFTTrainer

from ..config import ConfigError, SFTArguments, with_fields
from ..console import say
from ..run import make_launch_trainer
from .base import Task

__all__ = ["TASK", "SFTTask", "preview_lines"]

_NULL_WORDS = frozenset({"null", "None", "none", "~"})


def preview_lines(data: Any, tokenizer: Any, n: int, color: bool = False, response_template: str | None = None
                  ) -> list[str]:
    """``trl-padfree preview`` of prepared SFT data: ``n`` examples, then the counts (with a ``response_template``:
    how many of the examples checked for it lack it)."""
    from ..preview import IGNORE_INDEX, token_marker

    mark, train = token_marker(tokenizer, color), data.train
    lines: list[str] = []
    for index in range(min(n, len(train))):
        ids, labels = train[index]["input_ids"], train[index]["labels"]
        trained = sum(label != IGNORE_INDEX for label in labels)
        lines += [f"--- example {index} ({len(ids)} tokens, {trained} trained) ---", mark(ids, labels)]
    total = trained = 0
    for labels in train["labels"]:
        total += len(labels)
        trained += sum(label != IGNORE_INDEX for label in labels)
    share = 100.0 * trained / total if total else 0.0
    lines.append("---")
    lines.append(f"trained tokens: {trained:,} of {total:,} ({share:.1f}%) in {len(train):,} training examples "
                 f"(format: {data.text_format})")
    loaded, dropped = data.loaded.get("train", len(train)), data.dropped.get("train", 0)
    lines.append(f"examples without a trained token (dropped before training): {dropped:,} of {loaded:,}")
    if response_template is not None and data.checked:
        lines.append(f"examples without the response template among the first {data.checked:,}: "
                     f"{data.template_missing_in_check:,}")
    return lines


class SFTTask(Task):
    name = "sft"
    command = "train"
    trainer_name = "SFTTrainer"
    arguments = SFTArguments

    def check(self, cfg: Any) -> None:
        training = cfg.training
        if training.packing:
            raise ConfigError(
                "packing is not supported by trl-padfree train: padding_free: true already removes padding and keeps "
                "the number of optimizer steps; set packing: false"
            )
        if training.assistant_only_loss:
            raise ConfigError(
                "assistant_only_loss does not apply here: the collator trains what follows response_template; for "
                "multi-turn data also set instruction_template; set assistant_only_loss: false"
            )

    def resolve(self, cfg: Any) -> dict[str, Any]:
        training = cfg.training
        return {
            "training": with_fields(
                training,  # `--response_template null` on the command line arrives as the text "null"
                response_template=None if training.response_template in _NULL_WORDS else training.response_template
                or None,
                instruction_template=None if all(t in _NULL_WORDS for t in training.instruction_template or [])
                else training.instruction_template,
                padding_free=False,  # the collator flattens by itself; TRL refuses a custom collator otherwise
                dataset_kwargs={**(training.dataset_kwargs or {}), "skip_prepare_dataset": True},
            ),
        }

    def load_data(self, cfg: Any, tokenizer: Any) -> Any:
        from .sft_data import prepare_data

        return prepare_data(cfg, tokenizer)

    def prepare_data(self, cfg: Any, tokenizer: Any) -> Any:
        data, training = super().prepare_data(cfg, tokenizer), cfg.training
        if data.template_missing_in_check:
            say(f"warning: {data.template_missing_in_check} of the first {data.checked} examples have no response "
                f"template {cfg.training.response_template!r}")
        for split, count in data.dropped.items():
            if count:
                say(f"dropped {count} of {data.loaded[split]} {split} examples with no trained token left (response "
                    f"template missing, or the completion cut off by max_length={training.max_length})")
        return data

    def make_trainer(self, cfg: Any, tokenizer: Any, model: Any, ref_model: Any, data: Any,
                     callbacks: Sequence[Any]) -> Any:
        from .sft_data import training_collator

        collator = training_collator(cfg, tokenizer)  # the labels are the data's: it flattens (or pads) them
        # the templates labelled the data already (the trainer would build a collator from them)
        cfg = replace(cfg, training=with_fields(cfg.training, response_template=None, instruction_template=None))
        trainer = make_launch_trainer(SFTTrainer, cfg, tokenizer, model, data, callbacks, data_collator=collator)
        trainer.count_padding = True
        return trainer

    def summary_settings(self, cfg: Any) -> dict[str, Any]:
        return {"max_tokens_per_batch": cfg.training.max_tokens_per_batch}

    def preview(self, cfg: Any, tokenizer: Any, n: int, color: bool) -> list[str]:
        return preview_lines(self.load_data(cfg, tokenizer), tokenizer, n, color, cfg.training.response_template)


TASK = SFTTask()
