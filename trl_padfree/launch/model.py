"""The model and tokenizer of a run (the tokenizer also of ``preview``): loaded with the config's settings and
checked against each other; a failure is a :class:`~.config.ConfigError` before anything is written."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..exception_text import one_line
from .config import ConfigError, LaunchConfig
from .console import say


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


def load_model(cfg: LaunchConfig, auto_class: Any = None) -> tuple[Any, LaunchConfig]:
    """``(model, cfg with the attention it was loaded with)``; ``auto_class``: default ``AutoModelForCausalLM``.
    When ``auto`` picked ``"padfree"`` and the model cannot use it, it loads with its own default attention
    (:mod:`trl_padfree.attn_fallback`)."""
    from transformers import AutoModelForCausalLM, set_seed
    from trl import get_quantization_config

    import trl_padfree.attention  # noqa: F401  (registers attn_implementation="padfree")
    from trl_padfree.attn_fallback import ModelLoadError, load_with_fallback

    name, quantization = cfg.model.model_name_or_path, get_quantization_config(cfg.model)
    kwargs: dict[str, Any] = dict(revision=cfg.model.model_revision, dtype=cfg.model.dtype,
                                  trust_remote_code=cfg.training.trust_remote_code)
    if quantization is not None:
        from accelerate import PartialState

        # k-bit weights are placed at load time, one full copy per process (TRL's own scripts do the same)
        kwargs.update(quantization_config=quantization, device_map={"": PartialState().local_process_index})
    kwargs.update(cfg.model_init_kwargs or {})  # validated: no key of the launcher's own fields

    def load(attn_implementation: str | None) -> Any:
        set_seed(cfg.training.seed)  # a head the checkpoint lacks (a reward model's score) starts the same every run
        attn = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
        return (auto_class or AutoModelForCausalLM).from_pretrained(name, **attn, **kwargs)

    def announce(why: str) -> None:
        say(f"attn_implementation auto: {name} cannot use 'padfree' ({why}); loading it with its default attention "
            "instead (padding-free batches then rely on the model's own packed-sequence mask, which the packing "
            "probe checks)")

    try:
        model = load_with_fallback(load, cfg.attn_implementation, auto=cfg.attn_auto, on_fallback=announce,
                                   inspect=lambda model: materialized(model) and not sharded_launch(cfg.training))
    except ModelLoadError as exc:
        raise ConfigError(f"could not load model {name!r}: {str(exc)[:300]}") from None
    attn = model.config._attn_implementation
    if cfg.attn_auto and attn != cfg.attn_implementation:  # it fell back
        cfg.model.attn_implementation = attn
        say(f"attn_implementation: {attn!r}")
    check_lora_targets(cfg, model)
    return model, _shared_prompt_default(cfg, model)


def check_lora_targets(cfg: LaunchConfig, model: Any) -> None:
    """With ``use_peft``: every entry of ``lora_target_modules`` must match a module of the loaded model (peft itself
    refuses, when the trainer is built, only targets of which none matches)."""
    if not cfg.model.use_peft:
        return
    from peft.tuners.tuners_utils import check_target_module_exists
    from trl import get_peft_config

    peft_config = get_peft_config(cfg.model)
    targets = peft_config.target_modules
    if targets is None or targets == "all-linear":
        return
    one = isinstance(targets, str)  # (one regular expression over the full module names)
    names = [name for name, _ in model.named_modules() if name]
    unmatched = [entry for entry in ([targets] if one else sorted(targets)) if not any(
        check_target_module_exists(dataclasses.replace(peft_config, target_modules=entry if one else [entry]), name)
        for name in names)]
    if unmatched:
        linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                         if name and type(module).__name__ in ("Linear", "Conv1D")})
        options = f"its linear layers are named {', '.join(linear[:12])}" if linear else "it has no linear layers"
        raise ConfigError(f"lora_target_modules {', '.join(map(repr, unmatched))} match no module of "
                          f"{cfg.model.model_name_or_path!r}; {options} (or use all-linear)")


def _shared_prompt_default(cfg: LaunchConfig, model: Any) -> LaunchConfig:
    """An unset ``prompt_once`` (GRPO, RLOO) is off for a model with recurrent layers, which a prompt shared through
    the attention's key index cannot reach; one set to true is refused (before the probe, whose advice would be
    about padding_free)."""
    from trl_padfree.recurrent import recurrent_layer_types, refuse_shared_prompt

    if getattr(cfg.training, "prompt_once", False):
        try:
            refuse_shared_prompt(model, "prompt_once: true")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    layers = [] if "prompt_once" in cfg.explicit or cfg.task not in ("grpo", "rloo") else recurrent_layer_types(model)
    if layers:
        say(f"prompt_once: off ({layers[0]} layers cannot share a prompt's state through the attention's key index)")
        cfg.explicit, cfg.training.prompt_once = cfg.explicit | {"prompt_once"}, False
    return cfg


def materialized(model: Any) -> bool:
    """Whether this process holds the model's real weights (not meta tensors, not DeepSpeed ZeRO-3 shards)."""
    return all(p.device.type != "meta" and not hasattr(p, "ds_id") for p in model.parameters())


def sharded_launch(training: Any) -> bool:
    """Whether the run shards the weights at load time (FSDP or DeepSpeed, from accelerate's launcher or the config)."""
    return bool(training.deepspeed or training.fsdp) or any(
        os.environ.get(f"ACCELERATE_USE_{name}", "false").lower() == "true" for name in ("FSDP", "DEEPSPEED"))
