"""``trl-padfree train``: SFT with :class:`trl_padfree.SFTTrainer` on the data tokenized and labelled once by
:mod:`.sft_data` (the collator only flattens those labels); the logs add ``padding_share``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trl_padfree.configs import SFTConfig as CONFIG
from trl_padfree.trainer import SFTTrainer as TRAINER

from .. import steps
from ..config import ConfigError
from ..config import SFTArguments as ARGUMENTS
from ..console import say
from .sft_data import prepare_data, training_collator

__all__ = ["ARGUMENTS", "CONFIG", "TRAINER", "check", "preview", "run"]

_NULL_WORDS = frozenset({"null", "None", "none", "~"})


def check(cfg: Any) -> None:
    """TRL's ``packing`` and ``assistant_only_loss`` do not apply; ``--response_template null`` means None."""
    training = cfg.training
    if training.packing:
        raise ConfigError("packing is not supported by trl-padfree train: padding_free: true already removes padding "
                          "and keeps the number of optimizer steps; set packing: false")
    if training.assistant_only_loss:
        raise ConfigError("assistant_only_loss does not apply here: the collator trains what follows "
                          "response_template; for multi-turn data also set instruction_template; set "
                          "assistant_only_loss: false")
    if training.response_template in _NULL_WORDS or not training.response_template:
        training.response_template = None
    if all(t in _NULL_WORDS for t in training.instruction_template or []):
        training.instruction_template = None


def run(cfg: Any, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    training = cfg.training
    tokenizer, data = steps.load_data(cfg, prepare_data, "examples")
    if data.template_missing_in_check:
        say(f"warning: {data.template_missing_in_check} of the first {data.checked} examples have no response "
            f"template {training.response_template!r}")
    for split, count in data.dropped.items():
        if count:
            say(f"dropped {count} of {data.loaded[split]} {split} examples with no trained token left (response "
                f"template missing, or the completion cut off by max_length={training.max_length})")
    model, cfg = steps.load_policy(cfg)
    collator = training_collator(cfg, tokenizer)  # the labels are the data's: it flattens (or pads) them
    # the data is labelled and prepared already: the trainer builds no collator from the templates, prepares nothing
    training.response_template = training.instruction_template = None
    training.dataset_kwargs = {**(training.dataset_kwargs or {}), "skip_prepare_dataset": True}
    trainer = steps.make_trainer(cfg, TRAINER, tokenizer, model, data, callbacks, data_collator=collator)
    trainer.count_padding = True
    return steps.fit(cfg, trainer, data, {"max_tokens_per_batch": training.max_tokens_per_batch})


def preview(cfg: Any, tokenizer: Any, n: int, color: bool = False) -> list[str]:
    """``n`` prepared examples, trained tokens marked, then the counts."""
    from ..preview import IGNORE_INDEX, percent, token_marker

    data = prepare_data(cfg, tokenizer)
    mark, train, lines = token_marker(tokenizer, color), data.train, []
    total = trained = 0
    for index, labels in enumerate(train["labels"]):
        scored = sum(label != IGNORE_INDEX for label in labels)
        total, trained = total + len(labels), trained + scored
        if index < n:
            lines += [f"--- example {index} ({len(labels)} tokens, {scored} trained) ---",
                      mark(train[index]["input_ids"], labels)]
    loaded, dropped = data.loaded.get("train", len(train)), data.dropped.get("train", 0)
    lines += ["---", f"trained tokens: {trained:,} of {total:,} ({percent(trained, total)}) in {len(train):,} "
              f"training examples (format: {data.text_format})",
              f"examples without a trained token (dropped before training): {dropped:,} of {loaded:,}"]
    if cfg.training.response_template is not None and data.checked:
        lines.append(f"examples without the response template among the first {data.checked:,}: "
                     f"{data.template_missing_in_check:,}")
    return lines
