"""``trl-padfree train``: SFT with :class:`trl_padfree.SFTTrainer` and this package's completion-only collator; the
data tokenized and labelled once by :mod:`.sft_data`, the collator only flattens those labels. The training logs
add ``padding_share`` (``count_padding`` of :class:`trl_padfree.throughput.RealTokensLog`)."""

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

__all__ = ["ARGUMENTS", "CONFIG", "TRAINER", "check", "preview", "run", "settings"]

_NULL_WORDS = frozenset({"null", "None", "none", "~"})


def check(cfg: Any) -> None:
    """TRL's ``packing`` and ``assistant_only_loss`` do not apply; ``--response_template null`` (text on the command
    line) means None."""
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


def settings(cfg: Any) -> dict[str, Any]:
    """No fields of its own on the run line."""
    return {}


def run(cfg: Any, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Data (tokenized and labelled), model, probe, trainer with the collator that flattens, train, save."""
    tokenizer, data = steps.load_data(cfg, prepare_data)
    steps.say_data(data, "examples")
    if data.template_missing_in_check:
        say(f"warning: {data.template_missing_in_check} of the first {data.checked} examples have no response "
            f"template {cfg.training.response_template!r}")
    for split, count in data.dropped.items():
        if count:
            say(f"dropped {count} of {data.loaded[split]} {split} examples with no trained token left (response "
                f"template missing, or the completion cut off by max_length={cfg.training.max_length})")
    model, cfg = steps.load_policy(cfg)
    steps.probe_model(cfg, model)
    collator = training_collator(cfg, tokenizer)  # the labels are the data's: it flattens (or pads) them
    # the templates labelled the data already (the trainer would build a collator from them), TRL's preparation too
    training = cfg.training
    training.response_template = training.instruction_template = None
    training.dataset_kwargs = {**(training.dataset_kwargs or {}), "skip_prepare_dataset": True}
    trainer = steps.make_trainer(cfg, TRAINER, tokenizer, model, data, callbacks, data_collator=collator)
    trainer.count_padding = True
    return steps.fit(cfg, trainer, data, {"max_tokens_per_batch": training.max_tokens_per_batch})


def preview(cfg: Any, tokenizer: Any, n: int, color: bool = False) -> list[str]:
    """``trl-padfree preview`` of an SFT config: ``n`` prepared examples, trained tokens marked, then the counts (with
    a ``response_template``: how many of the examples checked for it lack it)."""
    from ..preview import IGNORE_INDEX, token_marker

    data = prepare_data(cfg, tokenizer)
    mark, train = token_marker(tokenizer, color), data.train
    lines: list[str] = []
    total = trained = 0
    for index, labels in enumerate(train["labels"]):
        scored = sum(label != IGNORE_INDEX for label in labels)
        total, trained = total + len(labels), trained + scored
        if index < n:
            lines += [f"--- example {index} ({len(labels)} tokens, {scored} trained) ---",
                      mark(train[index]["input_ids"], labels)]
    loaded, dropped = data.loaded.get("train", len(train)), data.dropped.get("train", 0)
    lines += ["---", f"trained tokens: {trained:,} of {total:,} ({steps.percent(trained, total)}) in {len(train):,} training examples "
              f"(format: {data.text_format})",
              f"examples without a trained token (dropped before training): {dropped:,} of {loaded:,}"]
    if cfg.training.response_template is not None and data.checked:
        lines.append(f"examples without the response template among the first {data.checked:,}: "
                     f"{data.template_missing_in_check:,}")
    return lines

