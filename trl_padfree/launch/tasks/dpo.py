"""``trl-padfree dpo``: preference training with :class:`trl_padfree.DPOTrainer` (TRL's, padding-free): the stages of
``trl-padfree train`` with TRL's ``DPOConfig``, the records checked by :mod:`.preference_data`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any
from unittest import mock

from trl_padfree.dpo import DPOTrainer

from ..config import ConfigError
from ..run import make_launch_trainer
from .base import Records, first_last
from .preference_data import check_preference_records, dropped_by_trainer, load_checked, prepared_by_trl
from .shared import PreferenceTask

__all__ = ["TASK", "DPOTask", "load_preference_data", "preference_summary", "preview_pairs"]


def load_preference_data(cfg: Any, tokenizer: Any) -> Records:
    """The training and eval pairs, checked (TRL's ``DPOTrainer`` tokenizes them when it is built)."""
    train, eval_ds, conversational = load_checked(cfg, tokenizer, check_preference_records)
    return Records(train, eval_ds, "conversational" if conversational else "prompt/chosen/rejected")


def preference_summary(lines: list[str], history: list[dict[str, Any]]) -> list[str]:
    """The run's summary lines for DPO: the eval reward accuracy and margin added, first and last (at the start the
    policy is the reference: every reward is 0, so no pair is won and the accuracy is 0).

    >>> preference_summary(["steps: 2/2", "real tokens/s: 1,234"], [{"eval_rewards/accuracies": 0.0,
    ...     "eval_rewards/margins": 0.0}, {"eval_rewards/accuracies": 0.9, "eval_rewards/margins": 2.5}])
    ['steps: 2/2', 'real tokens/s: 1,234', 'eval reward accuracy: 0.000 -> 0.900 (margin 0.000 -> 2.500)']
    """
    out = list(lines)
    evals = [e for e in history if "eval_rewards/accuracies" in e]
    if evals:
        out.append(f"eval reward accuracy: {first_last(evals, 'eval_rewards/accuracies')} "
                   f"(margin {first_last(evals, 'eval_rewards/margins')})")
    return out


def _check_preference_losses(training: Any) -> None:
    """``loss_type`` and ``f_divergence_type`` known to the trainer (TRL accepts an unknown ``f_divergence_type`` and
    fails at the first step), before anything is loaded."""
    from trl_padfree.dpo_loss import F_DIVERGENCE_TYPES, LOSS_TYPES

    divergence = getattr(training, "f_divergence_type", "reverse_kl")
    if divergence not in F_DIVERGENCE_TYPES:
        raise ConfigError(f"f_divergence_type: {divergence!r} is not one TRL knows; use one of "
                          f"{', '.join(F_DIVERGENCE_TYPES)} (reverse_kl, the default, is standard DPO)")
    losses = training.loss_type if isinstance(training.loss_type, list) else [training.loss_type]
    unknown = [t for t in losses if t not in LOSS_TYPES]
    if unknown and training.padding_free:
        raise ConfigError(f"loss_type: {', '.join(map(repr, unknown))} is not a DPO loss type; use one of "
                          f"{', '.join(LOSS_TYPES)} (sigmoid is standard DPO)")


def preview_pairs(cfg: Any, tokenizer: Any, data: Records, n: int, color: bool = False) -> list[str]:
    """``trl-padfree preview`` of a DPO config: ``n`` pairs tokenized by TRL's own ``DPOTrainer`` preparation and
    cut by the preference collator, the scored tokens of the chosen and of the rejected response marked, then the
    counts over the training set (and what ``prompt_once`` saves)."""
    import trl

    from trl_padfree.preference import truncate_pair

    from ..preview import token_marker

    training = cfg.training
    pairs = prepared_by_trl(trl.DPOTrainer, data.train, tokenizer, training)
    mark = token_marker(tokenizer, color)

    def shown(prompt: list[int], response: list[int]) -> str:
        return mark(prompt + response, [-100] * len(prompt) + response)

    lines: list[str] = []
    totals = {"tokens": 0, "chosen": 0, "rejected": 0, "once": 0}
    for index, pair in enumerate(pairs):
        p_c, chosen = truncate_pair(pair["prompt_ids"], pair["chosen_ids"], training.max_length, training.truncation_mode)
        p_r, rejected = truncate_pair(pair["prompt_ids"], pair["rejected_ids"], training.max_length,
                                      training.truncation_mode)
        totals["tokens"] += len(p_c) + len(chosen) + len(p_r) + len(rejected)
        totals["chosen"] += len(chosen)
        totals["rejected"] += len(rejected)
        shared = p_c == p_r and bool(p_c)
        totals["once"] += len(p_c) + len(chosen) + (1 + len(rejected) if shared else len(p_r) + len(rejected))
        if index < n:
            lines.append(f"--- pair {index} (prompt {len(p_c)} tokens; scored: chosen {len(chosen)}, rejected "
                         f"{len(rejected)}) ---")
            lines.append("chosen:   " + shown(p_c, chosen))
            lines.append("rejected: " + shown(p_r, rejected))
    lines.append("---")
    lines.append(f"scored tokens: chosen {totals['chosen']:,}, rejected {totals['rejected']:,} of {totals['tokens']:,} "
                 f"tokens in {len(pairs):,} pairs (format: {data.text_format})")
    saved = 100.0 * (1 - totals["once"] / totals["tokens"]) if totals["tokens"] else 0.0
    lines.append(f"prompt_once forwards {totals['once']:,} tokens instead of {totals['tokens']:,} ({saved:.1f}% fewer)")
    dropped = len(data.train) - len(pairs)
    lines.append(f"pairs dropped before training (prompt alone fills max_length={training.max_length}): {dropped:,} "
                 f"of {len(data.train):,}")
    return lines


class DPOTask(PreferenceTask):
    name = "dpo"
    command = "dpo"
    trainer_name = "DPOTrainer"

    def check(self, cfg: Any) -> None:
        _check_preference_losses(cfg.training)
        super().check(cfg)

    unit, load_data = "pairs", staticmethod(load_preference_data)

    def check_trainer(self, cfg: Any, trainer: Any, data: Any) -> None:
        dropped_by_trainer(cfg, trainer, data)

    def make_trainer(self, cfg: Any, tokenizer: Any, model: Any, ref_model: Any, data: Any,
                     callbacks: Sequence[Any]) -> Any:
        # with disable_tqdm, no "Computing reference log probs" bar (TRL shows it while the trainer is built)
        with mock.patch.dict(os.environ, {"TQDM_DISABLE": "1"} if cfg.training.disable_tqdm else {}):
            return make_launch_trainer(DPOTrainer, cfg, tokenizer, model, data, callbacks, ref_model=ref_model)

    summary_lines = staticmethod(preference_summary)

    def preview(self, cfg: Any, tokenizer: Any, n: int, color: bool) -> list[str]:
        return preview_pairs(cfg, tokenizer, load_preference_data(cfg, tokenizer), n, color)


TASK = DPOTask()
