"""``trl-padfree kto``: :class:`trl_padfree.KTOTrainer` (trl >= 1.16) on unpaired ``prompt`` / ``completion`` /
``label`` records or the preference pairs of ``trl-padfree dpo`` (TRL unpairs them); a reference model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trl

from trl_padfree.configs import KTOConfig as CONFIG
from trl_padfree.kto import KTOTrainer as TRAINER

from .. import steps
from ..config import ChatArguments as ARGUMENTS
from ..config import ConfigError
from .preference_data import (
    check_kinds,
    check_preference_records,
    dropped_by_trainer,
    load_checked,
    prepared_by_trl,
)

__all__ = ["ARGUMENTS", "CONFIG", "TRAINER", "preview", "run", "settings"]


def settings(cfg: Any) -> dict[str, Any]:
    return {**steps.prompt_once_settings(cfg), "loss_type": cfg.training.loss_type}


def check_records(dataset: Any, source: str) -> None:
    """Unpaired ``prompt`` / ``completion`` / ``label`` records, or preference pairs (``chosen`` / ``rejected``)."""
    columns = list(dataset.column_names)
    if "chosen" in columns or "rejected" in columns:
        return check_preference_records(dataset, source)
    missing = [c for c in ("prompt", "completion", "label") if c not in columns]
    if missing:
        raise ConfigError(
            f"{source}: KTO records need 'prompt', 'completion' and 'label' (true: desirable), or preference pairs "
            f"'prompt', 'chosen', 'rejected'; missing {', '.join(repr(m) for m in missing)} (columns: "
            f"{', '.join(columns)})")
    for index, label in enumerate(dataset["label"]):
        if not isinstance(label, bool):
            raise ConfigError(f"{source} record {index} (counting from 0): 'label' must be true (desirable) or false "
                              f"(undesirable), got {label!r}; fix the record")
    check_kinds(dataset.select_columns(["prompt", "completion"]), source, ["prompt", "completion"], ("completion",))


def load_records(cfg: Any, tokenizer: Any) -> steps.Records:
    train, eval_ds, conversational = load_checked(cfg, tokenizer, check_records)
    paired = "chosen" in train.column_names
    kind = "conversational" if conversational else "text"
    return steps.Records(train, eval_ds, f"{kind}, " + ("prompt/chosen/rejected pairs" if paired
                                                        else "prompt/completion/label"), paired=paired)


def run(cfg: Any, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    tokenizer, data = steps.load_data(cfg, load_records)
    labels = [True, False] * len(data.train) if data.paired else [bool(v) for v in data.train["label"]]
    noun = "pairs" if data.paired else "examples"
    eval_noun = data.eval is not None and ("pairs" if "chosen" in data.eval.column_names else "examples")
    steps.say_data(data, noun, f"; training examples: {sum(labels)} desirable, {len(labels) - sum(labels)} undesirable"
                   + (", each pair unpaired by TRL" if data.paired else ""), eval_noun)
    model, cfg = steps.load_policy(cfg, "preference")
    ref_model = steps.load_reference(cfg)
    per_record = 2 if data.paired else 1  # (TRL unpairs a pair into two examples)
    trainer = steps.make_trainer(cfg, TRAINER, tokenizer, model, data, callbacks, ref_model=ref_model,
                                 check=lambda trainer: dropped_by_trainer(cfg, trainer, data, noun, per_record))
    return steps.fit(cfg, trainer, data, settings(cfg), steps.eval_summary(
        "eval rewards", {"eval_rewards/chosen": "desirable ", "eval_rewards/rejected": "undesirable "},
        {"eval_rewards/margins": "margin ", "eval_kl": "KL "}))


def preview(cfg: Any, tokenizer: Any, n: int, color: bool = False) -> list[str]:
    """``n`` examples as TRL's ``KTOTrainer`` tokenizes them (pairs unpaired), scored tokens marked, the totals."""
    from trl_padfree.preference import truncate_pair

    from ..preview import percent, scored, token_marker

    training, data = cfg.training, load_records(cfg, tokenizer)
    examples = prepared_by_trl(trl.KTOTrainer, data.train, tokenizer, training)
    mark = token_marker(tokenizer, color)
    lines = [f"{len(examples)} training examples (format: {data.text_format}); each scored on its completion, and a "
             "KL sequence (its prompt with another example's completion) per example "
             f"(padding_free={cfg.padding_free}, prompt_once={bool(training.prompt_once)})"]
    total = scored_total = 0
    for index, ex in enumerate(examples):
        prompt, completion = truncate_pair(ex["prompt_ids"], ex["completion_ids"], training.max_length, "keep_start")
        total, scored_total = total + len(prompt) + len(completion), scored_total + len(completion)
        if index < n:
            label = "desirable" if ex["label"] else "undesirable"
            lines += [f"--- example {index} ({label}; prompt {len(prompt)} tokens, completion {len(completion)}) ---",
                      scored(mark, prompt, completion)]
    unpaired = 2 * len(data.train) if data.paired else len(data.train)
    return [*lines, "---", f"scored tokens: {scored_total:,} of {total:,} ({percent(scored_total, total)}) in "
            f"{len(examples):,} examples",
            f"examples dropped before training (prompt alone fills max_length={training.max_length}): "
            f"{unpaired - len(examples):,} of {unpaired:,}"]
