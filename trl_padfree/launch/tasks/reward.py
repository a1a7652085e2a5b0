"""``trl-padfree reward``: :class:`trl_padfree.RewardTrainer` on the preference records of ``trl-padfree dpo`` (plus
an optional numeric ``margin``); the model is a sequence classifier with one label (a causal LM checkpoint gets a
fresh, seeded ``score`` head, as ``trl reward`` does)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trl
from transformers import AutoModelForSequenceClassification

from trl_padfree.configs import RewardConfig as CONFIG
from trl_padfree.reward import RewardTrainer as TRAINER

from .. import steps
from ..config import ConfigError
from ..config import LaunchArguments as ARGUMENTS
from .preference_data import check_preference_records, dropped_by_trainer, load_checked, prepared_by_trl

__all__ = ["ARGUMENTS", "CONFIG", "TRAINER", "check", "preview", "run"]

#: which pairs TRL's RewardTrainer drops (dropped_by_trainer's rule), and why
TOO_LONG, WHY = "whose chosen or rejected sequence has more than max_length={} tokens", "a reward is read at the end"


def check(cfg: Any) -> None:
    """With ``use_peft`` LoRA's task type is ``SEQ_CLS`` (peft then also trains the new score head)."""
    if cfg.model.use_peft and "lora_task_type" not in cfg.explicit:
        cfg.model.lora_task_type = "SEQ_CLS"


def check_records(dataset: Any, source: str) -> None:
    """The preference records of ``trl-padfree dpo``, plus an optional ``margin`` that is a number in every record."""
    check_preference_records(dataset, source)
    for index, value in enumerate(dataset["margin"] if "margin" in dataset.column_names else []):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source} record {index} (counting from 0): 'margin' must be a number (the reward "
                              f"gap the pair should have), got {value!r}; fix the record or drop the column")


def load_pairs(cfg: Any, tokenizer: Any) -> steps.Records:
    train, eval_ds, conversational = load_checked(cfg, tokenizer, check_records)
    return steps.Records(train, eval_ds, ("conversational" if conversational else "prompt/chosen/rejected")
                         + (", with margins" if "margin" in train.column_names else ""))


def run(cfg: Any, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    tokenizer, data = steps.load_data(cfg, load_pairs, "pairs")
    cfg.model_init_kwargs = {"num_labels": 1, **(cfg.model_init_kwargs or {})}  # one score, as TRL's RewardTrainer
    model, cfg = steps.load_policy(cfg, "reward", AutoModelForSequenceClassification)
    trainer = steps.make_trainer(cfg, TRAINER, tokenizer, model, data, callbacks,
                                 check=lambda trainer: dropped_by_trainer(cfg, trainer, data, rule=TOO_LONG, why=WHY))
    return steps.fit(cfg, trainer, data, steps.prompt_once_settings(cfg), steps.eval_summary(
        "eval accuracy", {"eval_accuracy": ""}, {"eval_margin": "reward margin "}))


def preview(cfg: Any, tokenizer: Any, n: int, color: bool = False) -> list[str]:
    """``n`` tokenized pairs, the token each reward is read at marked, what one pair forwards in the flat row (and
    with ``prompt_once``), then the totals."""
    from trl_padfree.reward_layout import shared_prefix

    from ..preview import scored, token_marker

    once, mark = bool(cfg.training.prompt_once), token_marker(tokenizer, color)
    data = load_pairs(cfg, tokenizer)  # as TRL's RewardTrainer prepares them, the pairs it drops said
    train, eval_ds = (prepared_by_trl(trl.RewardTrainer, d, tokenizer, cfg.training) for d in (data.train, data.eval))
    dropped_by_trainer(cfg, (train, eval_ds), data, rule=TOO_LONG, why=WHY)

    def forwarded(chosen: list[int], rejected: list[int]) -> int:
        shared = shared_prefix(chosen, rejected) if once else 0
        return len(chosen) + len(rejected) - (shared - 1 if shared else 0)

    lines = [f"{len(train)} training pairs; each pair: the chosen and the rejected sequence, each scored at its "
             f"last token (padding_free={cfg.padding_free}, prompt_once={once})"]
    flat = padded = 0
    for index, pair in enumerate(train):
        chosen, rejected = list(pair["chosen_ids"]), list(pair["rejected_ids"])
        flat += forwarded(chosen, rejected)
        padded += 2 * max(len(chosen), len(rejected))
        if index < n:
            lines += [f"--- pair {index} (chosen {len(chosen)} tokens, rejected {len(rejected)}, common prefix "
                      f"{shared_prefix(chosen, rejected)}; forwarded {forwarded(chosen, rejected)}) ---",
                      "chosen:   " + scored(mark, chosen[:-1], chosen[-1:]),
                      "rejected: " + scored(mark, rejected[:-1], rejected[-1:])]
    return [*lines, "---", f"forwarded tokens: {flat:,} in {len(train):,} pairs (TRL's padded rows, one pair per "
            f"batch: {padded:,}; a larger batch pads to its longest sequence)"]
