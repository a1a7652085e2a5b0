"""``trl-padfree dpo``: preference training with :class:`trl_padfree.DPOTrainer` (TRL's, padding-free).

``trl-padfree dpo`` is ``trl-padfree train`` with TRL's ``DPOConfig`` in place of ``SFTConfig`` (as ``trl dpo`` and
``trl sft`` share one parser): the same stages (:mod:`..run`). Its own parts, here:
:class:`trl_padfree.DPOConfig` (``prompt_once``: compute each pair's prompt once, needs ``"padfree"`` attention;
``chat_template_path``); the SFT-only fields refused and ``attn_implementation`` made fit for the layout
(:meth:`DPOTask.check`, :meth:`DPOTask.resolve`); the records with ``chosen`` / ``rejected`` (and ``prompt``, or
TRL's implicit prompt), plain text or conversational, checked before TRL tokenizes them
(:func:`load_preference_data`, on :mod:`.preference_data`); the reference model and the preference probe
(:mod:`.shared`, as ``kto``'s); :class:`trl_padfree.DPOTrainer` with the launch's atomic checkpoints; the summary's
eval reward accuracy and ``prompt_once``; ``preview``'s pairs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl_padfree.dpo import DPOTrainer

from ..config import ConfigError
from ..console import say
from ..trainer_setup import LaunchTrainer, make_launch_trainer
from .preference_data import check_preference_records, dropped_by_trainer, load_checked
from .shared import PreferenceTask

__all__ = ["TASK", "DPOTask", "PreparedPreferences", "load_preference_data",
           "preference_summary", "preview_pairs"]


@dataclass
class PreparedPreferences:
    train: Any
    eval: Any | None
    text_format: str
    dropped: dict[str, int] = field(default_factory=dict)  # pairs TRL drops by truncation, per split ("train", "eval")


def load_preference_data(cfg: Any, tokenizer: Any) -> PreparedPreferences:
    """The training and eval pairs, checked (TRL's ``DPOTrainer`` tokenizes them when it is built)."""
    train, eval_ds, conversational = load_checked(cfg, tokenizer, check_preference_records)
    return PreparedPreferences(train, eval_ds, "conversational" if conversational else "prompt/chosen/rejected")


class QuietReferencePrecompute:
    """With ``disable_tqdm`` (the launch sets it when the output is not a terminal) no "Computing reference log
    probs" bar (``precompute_ref_log_probs``: TRL shows it, while the trainer is built, unless ``TQDM_DISABLE`` is
    set). A mixin of the launch's ``DPOTrainer``."""

    def _precompute_ref_logps(self, *args: Any, **kwargs: Any) -> Any:  # TRL's (when the trainer is built)
        with tqdm_disabled(bool(getattr(self.args, "disable_tqdm", False))):
            return super()._precompute_ref_logps(*args, **kwargs)  # type: ignore[misc]


@contextlib.contextmanager
def tqdm_disabled(disable: bool) -> Iterator[None]:
    """``TQDM_DISABLE=1`` in the environment while the block runs, when ``disable`` (TRL reads it for its own bars)."""
    if not disable or os.environ.get("TQDM_DISABLE"):
        yield
        return
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        os.environ.pop("TQDM_DISABLE", None)


class LaunchDPOTrainer(QuietReferencePrecompute, LaunchTrainer, DPOTrainer):
    """The launch's ``DPOTrainer`` (:class:`~..trainer_setup.LaunchTrainer`, no reference-log-prob bar when quiet)."""


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
        first, last = evals[0], evals[-1]
        out.append(f"eval reward accuracy: {first['eval_rewards/accuracies']:.3f} -> {last['eval_rewards/accuracies']:.3f} "
                   f"(margin {first['eval_rewards/margins']:.3f} -> {last['eval_rewards/margins']:.3f})")
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


def preview_pairs(cfg: Any, tokenizer: Any, data: PreparedPreferences, n: int, color: bool = False
                  ) -> list[str]:
    """``trl-padfree preview`` of a DPO config: ``n`` pairs tokenized by TRL's own ``DPOTrainer`` preparation and
    cut by the preference collator, the scored tokens of the chosen and of the rejected response marked, then the
    counts over the training set (and what ``prompt_once`` saves)."""
    from types import SimpleNamespace

    import numpy as np
    import trl

    from trl_padfree.preference import truncate_pair
    from trl_padfree.token_text import TokenText

    from ..preview import marked_text

    training = cfg.training
    pairs = trl.DPOTrainer._prepare_dataset(SimpleNamespace(_tokenizer=tokenizer), data.train, tokenizer, training,
                                            "train")
    text = TokenText.from_tokenizer(tokenizer)

    def shown(prompt: list[int], response: list[int]) -> str:
        ids = prompt + response
        raw, starts = text.decode(np.asarray(ids, dtype=np.int64))
        labels = [-100] * len(prompt) + response
        return marked_text(raw, starts.tolist(), labels, color)

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
        """Refuse SFT-only settings and make ``attn_implementation`` fit the layout (before anything is loaded)."""
        if cfg.training.padding_free:
            from trl_padfree._compat import dpo_padding_free_unavailable

            problem = dpo_padding_free_unavailable()
            if problem is not None:
                raise ConfigError(problem)
        _check_preference_losses(cfg.training)
        super().check(cfg)

    def prepare_data(self, cfg: Any, tokenizer: Any) -> Any:
        """Checked preference records (TRL's DPOTrainer tokenizes them when built)."""
        data = load_preference_data(cfg, tokenizer)
        say(f"data: {len(data.train)} training pairs" + (f", {len(data.eval)} eval pairs" if data.eval is not None
                                                          else "") + f" (format: {data.text_format})")
        return data

    def check_trainer(self, cfg: Any, trainer: Any, data: Any) -> None:
        dropped_by_trainer(cfg, trainer, data)

    def make_trainer(self, cfg: Any, tokenizer: Any, model: Any, ref_model: Any, data: Any,
                     callbacks: Sequence[Any]) -> Any:
        """:class:`trl_padfree.DPOTrainer` with the launch's atomic checkpoints (the probe ran before it is built)."""
        return make_launch_trainer(LaunchDPOTrainer, cfg, tokenizer, model, data, callbacks, ref_model=ref_model)

    def summary_lines(self, lines: list[str], history: list[dict[str, Any]]) -> list[str]:
        return preference_summary(lines, history)

    def preview(self, cfg: Any, tokenizer: Any, n: int, color: bool) -> list[str]:
        return list(preview_pairs(cfg, tokenizer, load_preference_data(cfg, tokenizer), n, color))


TASK = DPOTask()
