"""``trl-padfree reward``: reward-model training with :class:`trl_padfree.RewardTrainer` (TRL's, padding-free) on the
preference records of ``trl-padfree dpo`` (plus an optional numeric ``margin``); the model is loaded as a sequence
classifier with one label (a causal LM checkpoint gets a fresh, seeded ``score`` head, as ``trl reward`` does)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trl

from trl_padfree.configs import RewardConfig as CONFIG
from trl_padfree.reward import RewardTrainer as TRAINER

from .. import steps
from ..config import ConfigError
from ..config import LaunchArguments as ARGUMENTS
from ..console import say
from .preference_data import check_preference_records, dropped_by_trainer, load_checked, prepared_by_trl

__all__ = ["ARGUMENTS", "CONFIG", "TRAINER", "check", "preview", "reward_summary", "run", "settings"]


def check(cfg: Any) -> None:
    """``prompt_once``; with ``use_peft`` LoRA's task type is ``SEQ_CLS`` (peft then trains the fresh score head
    too, ``modules_to_save``) unless set."""
    steps.check_prompt_once(cfg)
    if cfg.model.use_peft and "lora_task_type" not in cfg.explicit:
        cfg.model.lora_task_type = "SEQ_CLS"


settings = steps.prompt_once_settings


def check_reward_records(dataset: Any, source: str) -> None:
    """The preference records of ``trl-padfree dpo``, plus an optional ``margin`` that is a number in every record."""
    check_preference_records(dataset, source)
    if "margin" not in dataset.column_names:
        return
    for index, value in enumerate(dataset["margin"]):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source} record {index} (counting from 0): 'margin' must be a number (the reward "
                              f"gap the pair should have), got {value!r}; fix the record or drop the column")


def load_pairs(cfg: Any, tokenizer: Any) -> steps.Records:
    """The training and eval pairs, checked (TRL's ``RewardTrainer`` tokenizes them when it is built, dropping those
    longer than ``max_length``)."""
    train, eval_ds, conversational = load_checked(cfg, tokenizer, check_reward_records)
    return steps.Records(train, eval_ds, ("conversational" if conversational else "prompt/chosen/rejected")
                         + (", with margins" if "margin" in train.column_names else ""))


#: which pairs TRL's RewardTrainer drops (dropped_by_trainer's rule), and why
TOO_LONG, WHY = "whose chosen or rejected sequence has more than max_length={} tokens", "a reward is read at the end"


class SequenceClassifier:
    """``AutoModelForSequenceClassification`` with one output, the reward, loaded as TRL's ``RewardTrainer`` loads a
    model by name: transformers' load report of a causal LM checkpoint (its ``lm_head`` unused, ``score`` missing)
    replaced by a line saying that the head is new; other missing or unused weights are still named."""

    @staticmethod
    def from_pretrained(*args: Any, **kwargs: Any) -> Any:
        import logging

        from transformers import AutoModelForSequenceClassification

        report = logging.getLogger("transformers.modeling_utils")  # the logger of the load report
        level = report.level
        report.setLevel(logging.ERROR)
        try:
            model, info = AutoModelForSequenceClassification.from_pretrained(
                *args, num_labels=1, output_loading_info=True, **kwargs)
        finally:
            report.setLevel(level)
        odd = [k for k in (*info["missing_keys"], *info["unexpected_keys"]) if not k.startswith(("score.", "lm_head."))]
        if odd:
            say(f"warning: weights missing from or unused in the checkpoint: {', '.join(sorted(odd)[:8])}")
        source = [a for a in (getattr(model.config, "architectures", None) or []) if a != type(model).__name__]
        if source:
            say(f"reward model: {type(model).__name__} from a {source[0]} checkpoint, with a new score head "
                "(drawn from the config's seed)")
        return model


def run(cfg: Any, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Pairs, the model as a sequence classifier, probe, trainer (the pairs TRL dropped said), train, save."""
    tokenizer, data = steps.load_data(cfg, load_pairs)
    steps.say_data(data, "pairs")
    model, cfg = steps.load_policy(cfg, SequenceClassifier)
    steps.probe_model(cfg, model, layout="reward")
    trainer = steps.make_trainer(cfg, TRAINER, tokenizer, model, data, callbacks,
                                 check=lambda trainer: dropped_by_trainer(cfg, trainer, data, rule=TOO_LONG, why=WHY))
    return steps.fit(cfg, trainer, data, settings(cfg), reward_summary)


#: The summary's line of a reward run: the eval accuracy and mean reward margin
reward_summary = steps.eval_summary("eval accuracy", {"eval_accuracy": ""}, {"eval_margin": "reward margin "})


def preview(cfg: Any, tokenizer: Any, n: int, color: bool = False) -> list[str]:
    """``preview``'s lines: the first ``n`` tokenized pairs with the token each reward is read at marked, what one
    pair forwards in the flat row (and with ``prompt_once``), then the totals over the training set."""
    from trl_padfree.reward_layout import shared_prefix

    from ..preview import token_marker

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
                      "chosen:   " + steps.scored(mark, chosen[:-1], chosen[-1:]),
                      "rejected: " + steps.scored(mark, rejected[:-1], rejected[-1:])]
    lines += ["---", f"forwarded tokens: {flat:,} in {len(train):,} pairs (TRL's padded rows, one pair per batch: "
              f"{padded:,}; a larger batch pads to its longest sequence)"]
    return lines
