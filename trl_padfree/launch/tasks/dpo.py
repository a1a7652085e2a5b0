"""``trl-padfree dpo``: :class:`trl_padfree.DPOTrainer` on ``prompt`` / ``chosen`` / ``rejected`` records checked by
:mod:`.preference_data`; a reference model (none with ``use_peft``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any
from unittest import mock

from trl_padfree.configs import DPOConfig as CONFIG
from trl_padfree.dpo import DPOTrainer as TRAINER

from .. import steps
from ..config import ChatArguments as ARGUMENTS
from ..config import ConfigError
from .preference_data import check_preference_records, dropped_by_trainer, load_checked, prepared_by_trl

__all__ = ["ARGUMENTS", "CONFIG", "TRAINER", "check", "preview", "run"]


def check(cfg: Any) -> None:
    """``loss_type`` and ``f_divergence_type`` known to the trainer (TRL fails at the first step on an unknown
    ``f_divergence_type``)."""
    from trl_padfree.dpo_loss import F_DIVERGENCE_TYPES, LOSS_TYPES

    training = cfg.training
    divergence = getattr(training, "f_divergence_type", "reverse_kl")
    if divergence not in F_DIVERGENCE_TYPES:
        raise ConfigError(f"f_divergence_type: {divergence!r} is not one TRL knows; use one of "
                          f"{', '.join(F_DIVERGENCE_TYPES)} (reverse_kl, the default, is standard DPO)")
    losses = training.loss_type if isinstance(training.loss_type, list) else [training.loss_type]
    unknown = [t for t in losses if t not in LOSS_TYPES]
    if unknown and training.padding_free:
        raise ConfigError(f"loss_type: {', '.join(map(repr, unknown))} is not a DPO loss type; use one of "
                          f"{', '.join(LOSS_TYPES)} (sigmoid is standard DPO)")


def load_pairs(cfg: Any, tokenizer: Any) -> steps.Records:
    train, eval_ds, conversational = load_checked(cfg, tokenizer, check_preference_records)
    return steps.Records(train, eval_ds, "conversational" if conversational else "prompt/chosen/rejected")


def run(cfg: Any, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    tokenizer, data = steps.load_data(cfg, load_pairs, "pairs")
    model, cfg = steps.load_policy(cfg, "preference")
    ref_model = steps.load_reference(cfg)
    # with disable_tqdm, no "Computing reference log probs" bar (TRL shows it while the trainer is built)
    with mock.patch.dict(os.environ, {"TQDM_DISABLE": "1"} if cfg.training.disable_tqdm else {}):
        trainer = steps.make_trainer(cfg, TRAINER, tokenizer, model, data, callbacks, ref_model=ref_model,
                                     check=lambda trainer: dropped_by_trainer(cfg, trainer, data))
    # (at the start the policy is the reference: every reward is 0, so no pair is won)
    return steps.fit(cfg, trainer, data, steps.prompt_once_settings(cfg), steps.eval_summary(
        "eval reward accuracy", {"eval_rewards/accuracies": ""}, {"eval_rewards/margins": "margin "}))


def preview(cfg: Any, tokenizer: Any, n: int, color: bool) -> list[str]:
    """``n`` pairs as TRL's ``DPOTrainer`` tokenizes them and the preference collator cuts them, the scored tokens
    of each response marked, then the counts (and what ``prompt_once`` saves)."""
    import trl

    from trl_padfree.preference import truncate_pair

    from ..preview import percent, scored, token_marker

    training, data = cfg.training, load_pairs(cfg, tokenizer)
    pairs = prepared_by_trl(trl.DPOTrainer, data.train, tokenizer, training)
    mark, lines = token_marker(tokenizer, color), []
    tokens = chosen_total = rejected_total = once = 0
    for index, pair in enumerate(pairs):
        (p_c, chosen), (p_r, rejected) = (truncate_pair(pair["prompt_ids"], pair[f"{side}_ids"], training.max_length,
                                                        training.truncation_mode) for side in ("chosen", "rejected"))
        tokens += len(p_c) + len(chosen) + len(p_r) + len(rejected)
        chosen_total, rejected_total = chosen_total + len(chosen), rejected_total + len(rejected)
        once += len(p_c) + len(chosen) + (1 + len(rejected) if p_c == p_r and p_c else len(p_r) + len(rejected))
        if index < n:
            lines += [f"--- pair {index} (prompt {len(p_c)} tokens; scored: chosen {len(chosen)}, rejected "
                      f"{len(rejected)}) ---", "chosen:   " + scored(mark, p_c, chosen),
                      "rejected: " + scored(mark, p_r, rejected)]
    return [*lines, "---", f"scored tokens: chosen {chosen_total:,}, rejected {rejected_total:,} of {tokens:,} tokens "
            f"in {len(pairs):,} pairs (format: {data.text_format})",
            f"prompt_once forwards {once:,} tokens instead of {tokens:,} ({percent(tokens - once, tokens)} fewer)",
            f"pairs dropped before training (prompt alone fills max_length={training.max_length}): "
            f"{len(data.train) - len(pairs):,} of {len(data.train):,}"]
