"""The preference stages of ``trl-padfree dpo``: its own settings, the data, the reference model, the trainer.

``trl-padfree dpo`` is ``trl-padfree train`` with TRL's ``DPOConfig`` in place of ``SFTConfig`` (as ``trl dpo`` and
``trl sft`` share one parser): the same config parsing and validation, machine defaults, run line, checkpoints,
SIGTERM / Ctrl-C stop and resume, multi-process start and exit, and summary (:mod:`.run`). What differs lives here:

- :class:`~.config.PreferenceArguments`: ``prompt_once`` (compute each pair's prompt once; needs ``"padfree"`` attention);
- :func:`~.validate.check_preference_config`: the SFT-only fields refused, ``attn_implementation`` made fit for the layout;
- :func:`load_preference_data`: records with ``chosen`` / ``rejected`` (and ``prompt``, or TRL's implicit prompt),
  plain text or conversational, checked record by record before TRL tokenizes them;
- :func:`load_reference`: the frozen reference, loaded like the policy (none with ``use_peft``: the adapters are
  switched off instead, as TRL does);
- :func:`make_trainer`: :class:`trl_padfree.DPOTrainer` (padding-free through ``padding_free``, TRL's trainer
  unchanged without it), with the launch's atomic checkpoints.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import ConfigError, LaunchConfig, PreferenceArguments

__all__ = [
    "PreferenceArguments",  # defined with the other config dataclasses (.config)
    "PreparedPreferences",
    "load_preference_data",
    "load_reference",
    "make_trainer",
]


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)


def check_preference_records(dataset: Any, source: str) -> None:
    """Every record has ``chosen`` and ``rejected`` (and ``prompt`` when the responses do not hold it), all of one
    kind: text, or lists of chat messages. A bad record is a :class:`ConfigError` naming it and the fix."""
    columns = list(dataset.column_names)
    missing = [c for c in ("chosen", "rejected") if c not in columns]
    if missing:
        raise ConfigError(
            f"{source}: preference records need 'chosen' and 'rejected' (and usually 'prompt'); missing "
            f"{', '.join(repr(m) for m in missing)} (columns: {', '.join(columns)})"
        )
    from .dpo_data import mixed_kinds_error, value_kind

    fields = [c for c in ("prompt", "chosen", "rejected") if c in columns]
    first: tuple[int, str] | None = None
    for index, record in enumerate(dataset.select_columns(fields)):
        kinds = set()
        for name in fields:
            value = record[name]
            kind = value_kind(value)
            if kind is None:
                raise ConfigError(
                    f"{source} record {index} (counting from 0): {name!r} must be a string or a list of chat "
                    f"messages ({{'role', 'content'}}), got {type(value).__name__}; fix the record"
                )
            if first is None:
                first = (index, kind)
            elif kind != first[1] and first[0] != index:
                raise mixed_kinds_error(source, index, name, kind, *first)
            kinds.add(kind)
            if not value and name != "prompt":
                raise ConfigError(f"{source} record {index} (counting from 0): {name!r} is empty; drop the record "
                                  "or fill it in")
        if len(kinds) > 1:
            raise ConfigError(
                f"{source} record {index} (counting from 0): mixes text and chat messages across "
                f"{', '.join(fields)}; use one kind"
            )


@dataclass
class PreparedPreferences:
    train: Any
    eval: Any | None
    text_format: str
    dropped: dict[str, int] = field(default_factory=dict)  # pairs TRL drops by truncation, per split ("train", "eval")


def load_preference_data(cfg: LaunchConfig, tokenizer: Any) -> PreparedPreferences:
    """The training and eval pairs, checked (TRL's ``DPOTrainer`` tokenizes them when it is built)."""
    from .data import load_splits
    from .dpo_data import check_one_kind_in_files, check_truncation, tokenized_prompts

    for key in ("train_file", "eval_file"):
        if getattr(cfg.data, key, None):
            check_one_kind_in_files(key, getattr(cfg.data, key))
    train, eval_ds = load_splits(cfg.data, cfg.training.seed, check=check_preference_records)
    first = train[0]
    conversational = _is_messages(first["chosen"])
    if conversational and getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(
            f"the records are chat messages but the tokenizer of {cfg.model.model_name_or_path!r} has no chat "
            "template; set chat_template_path to a .jinja file, or use text records"
        )
    training = cfg.training
    dropped = {}
    sources = {"train": "train_file" if cfg.data.train_file else "the training data",
               "eval": "eval_file" if cfg.data.eval_file else "the eval data"}
    for split, dataset, what in (("train", train, "training"), ("eval", eval_ds, "eval")):
        if dataset is not None:
            lengths = tokenized_prompts(dataset, tokenizer, sources[split], training.max_length)
            dropped[split] = check_truncation(lengths, sources[split], what, training.max_length,
                                              training.truncation_mode)
    return PreparedPreferences(train, eval_ds, "conversational" if conversational else "prompt/chosen/rejected",
                               dropped)


def load_reference(cfg: LaunchConfig) -> Any:
    """The reference model: a second copy of the starting weights, or None with ``use_peft`` (adapters off)."""
    if cfg.model.use_peft:
        return None
    from .model import load_model

    return load_model(cfg)


class QuietReferencePrecompute:
    """With ``disable_tqdm`` (the launch sets it when the output is not a terminal) no "Computing reference log
    probs" bar (``precompute_ref_log_probs``: TRL shows it, while the trainer is built, unless ``TQDM_DISABLE`` is
    set). A mixin of the launch's ``DPOTrainer``."""

    def _precompute_ref_logps(self, *args: Any, **kwargs: Any) -> Any:  # TRL's (when the trainer is built)
        with tqdm_disabled(bool(getattr(self.args, "disable_tqdm", False))):
            return super()._precompute_ref_logps(*args, **kwargs)  # type: ignore[misc]


def make_trainer(cfg: LaunchConfig, tokenizer: Any, model: Any, ref_model: Any, data: PreparedPreferences,
                 callbacks: Sequence[Any], **kwargs: Any) -> Any:
    """:class:`trl_padfree.DPOTrainer` with the launch's atomic checkpoints (the probe ran before it is built);
    ``kwargs``: the shared launcher settings for the trainer (``Task.trainer_kwargs``)."""
    from trl_padfree.dpo import DPOTrainer

    from .trainer_class import make_launch_trainer

    return make_launch_trainer(DPOTrainer, cfg, tokenizer, model, data, callbacks, QuietReferencePrecompute,
                               ref_model=ref_model, prompt_once=bool(cfg.collator.prompt_once), **kwargs)


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


def preference_summary(lines: list[str], history: list[dict[str, Any]]) -> list[str]:
    """The run's summary lines for DPO: the SFT token-throughput line left out (TRL logs ``num_tokens``), the eval
    reward accuracy and margin added, first and last (at the start the policy is the reference: every reward is 0,
    so no pair is won and the accuracy is 0).

    >>> preference_summary(["steps: 2/2", "real tokens/s: n/a"], [{"eval_rewards/accuracies": 0.0,
    ...     "eval_rewards/margins": 0.0}, {"eval_rewards/accuracies": 0.9, "eval_rewards/margins": 2.5}])
    ['steps: 2/2', 'eval reward accuracy: 0.000 -> 0.900 (margin 0.000 -> 2.500)']
    """
    out = [line for line in lines if not line.startswith("real tokens/s")]
    evals = [e for e in history if "eval_rewards/accuracies" in e]
    if evals:
        first, last = evals[0], evals[-1]
        out.append(f"eval reward accuracy: {first['eval_rewards/accuracies']:.3f} -> {last['eval_rewards/accuracies']:.3f} "
                   f"(margin {first['eval_rewards/margins']:.3f} -> {last['eval_rewards/margins']:.3f})")
    return out


def probe_check(cfg: LaunchConfig) -> Any:
    """The probe the launch runs on the policy before anything is written (:func:`.probe.probe_model`)."""
    from functools import partial

    from trl_padfree.preference_probe import assert_preference_packing_safe

    return partial(assert_preference_packing_safe, prompt_once=bool(cfg.collator.prompt_once))
