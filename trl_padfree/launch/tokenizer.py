"""The tokenizer of a run and of ``preview``: loaded with the config's overrides, checked against the model; a
failure is a :class:`~.config.ConfigError` before anything is written."""

from __future__ import annotations

import os
from typing import Any

from .config import ConfigError, LaunchConfig
from .console import one_line

__all__ = ["load_pretrained", "load_tokenizer"]


def load_pretrained(auto_class: Any, cfg: LaunchConfig, what: str) -> Any:
    """``auto_class.from_pretrained`` of the model of ``cfg``, or ConfigError "could not {what} of ..."."""
    name = cfg.model.model_name_or_path
    try:
        return auto_class.from_pretrained(name, revision=cfg.model.model_revision,
                                          trust_remote_code=cfg.training.trust_remote_code)
    except Exception as exc:
        raise ConfigError(f"could not {what} of {name!r}: {one_line(exc)}") from None


def load_tokenizer(cfg: LaunchConfig) -> Any:
    """The tokenizer of ``model_name_or_path`` with the ``eos_token`` / ``pad_token`` / chat template overrides,
    refused when its token ids do not all fit the model's embeddings (an IndexError at the first step)."""
    from transformers import AutoConfig, AutoTokenizer

    training, name = cfg.training, cfg.model.model_name_or_path
    tokenizer = load_pretrained(AutoTokenizer, cfg, "load the tokenizer")
    for attr in ("eos_token", "pad_token"):
        value = getattr(training, attr, None)  # (DPOConfig has no eos_token)
        if value is not None and value not in tokenizer.get_vocab():
            raise ConfigError(f"{attr}={value!r} is not in the vocabulary of {name!r}")
        if value is not None:
            setattr(tokenizer, attr, value)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    if getattr(training, "max_length", None) is not None:  # the launch cuts (and counts) longer sequences itself:
        # transformers' warning that a text longer than model_max_length "will result in indexing errors" is untrue
        tokenizer.deprecation_warnings["sequence-length-is-longer-than-the-specified-maximum"] = True
    size = getattr(load_pretrained(AutoConfig, cfg, "read the model config").get_text_config(), "vocab_size", None)
    needed = max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)
    if isinstance(size, int) and 0 < size < needed:
        raise ConfigError(
            f"the tokenizer of {name!r} has {needed} token ids but the model's embeddings hold {size} (vocab_size): "
            f"use the tokenizer that belongs to this model, or resize the model's embeddings to {needed} "
            "(model.resize_token_embeddings) and save it")
    # SFTConfig's / RewardConfig's field; trl-padfree dpo / kto: the launch's (DPOConfig has none)
    path = getattr(training, "chat_template_path", None) or getattr(cfg.launch, "chat_template_path", None)
    if path is not None and not (os.path.isfile(path) and path.endswith((".jinja", ".j2"))):
        raise ConfigError(f"chat_template_path={path!r} must be an existing .jinja file")
    if path is not None:
        with open(path, encoding="utf-8") as handle:
            tokenizer.chat_template = handle.read()
    return tokenizer
