"""The tokenizer of a run and of ``preview``: loaded with the config's overrides, checked against the model; a
failure is a :class:`~.config.ConfigError` before anything is written."""

from __future__ import annotations

import os
from typing import Any

from .config import ConfigError, LaunchConfig
from .console import one_line

__all__ = ["LONGER_THAN_MAXIMUM", "check_vocabulary", "load_pretrained", "load_tokenizer"]

#: transformers' key for its once-per-tokenizer warning about texts longer than ``model_max_length``
LONGER_THAN_MAXIMUM = "sequence-length-is-longer-than-the-specified-maximum"


def load_pretrained(auto_class: Any, cfg: LaunchConfig, what: str) -> Any:
    """``auto_class.from_pretrained`` for the model of ``cfg``; :class:`ConfigError` "could not {what} of ..." if it fails."""
    name = cfg.model.model_name_or_path
    try:
        return auto_class.from_pretrained(name, revision=cfg.model.model_revision,
                                          trust_remote_code=cfg.training.trust_remote_code)
    except Exception as exc:
        raise ConfigError(f"could not {what} of {name!r}: {one_line(exc)}") from None


def load_tokenizer(cfg: LaunchConfig) -> Any:
    """The tokenizer of ``model_name_or_path`` with the ``eos_token`` / ``pad_token`` / chat template overrides."""
    from transformers import AutoTokenizer

    tokenizer, training = load_pretrained(AutoTokenizer, cfg, "load the tokenizer"), cfg.training
    for attr in ("eos_token", "pad_token"):
        value = getattr(training, attr, None)  # (DPOConfig has no eos_token)
        if value is not None and value not in tokenizer.get_vocab():
            raise ConfigError(f"{attr}={value!r} is not in the vocabulary of {cfg.model.model_name_or_path!r}")
        if value is not None:
            setattr(tokenizer, attr, value)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    if getattr(training, "max_length", None) is not None:
        # the launch cuts every sequence to max_length (and counts what it drops): transformers' once-per-tokenizer
        # warning that a text longer than model_max_length "will result in indexing errors" is not true here
        tokenizer.deprecation_warnings[LONGER_THAN_MAXIMUM] = True
    check_vocabulary(cfg, tokenizer)
    # SFTConfig's / RewardConfig's field; trl-padfree dpo / kto: the launch's (DPOConfig has none)
    path = getattr(training, "chat_template_path", None) or getattr(cfg.launch, "chat_template_path", None)
    if path is not None and not (os.path.isfile(path) and path.endswith((".jinja", ".j2"))):
        raise ConfigError(f"chat_template_path={path!r} must be an existing .jinja file")
    if path is not None:
        with open(path, encoding="utf-8") as handle:
            tokenizer.chat_template = handle.read()
    return tokenizer


def check_vocabulary(cfg: LaunchConfig, tokenizer: Any) -> None:
    """Refuse a tokenizer whose token ids do not all fit the model's embeddings (an IndexError at the first step
    that meets one of the extra tokens)."""
    from transformers import AutoConfig

    size = getattr(load_pretrained(AutoConfig, cfg, "read the model config").get_text_config(), "vocab_size", None)
    needed = max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)
    if isinstance(size, int) and 0 < size < needed:
        raise ConfigError(
            f"the tokenizer of {cfg.model.model_name_or_path!r} has {needed} token ids but the model's embeddings hold "
            f"{size} (vocab_size): use the tokenizer that belongs to this model, or resize the model's embeddings to "
            f"{needed} (model.resize_token_embeddings) and save it")
