"""Tokenizer, collator and model for ``trl-padfree train``, and the pre-flight packing probe.

Every failure here is bad input (a wrong path, a template the collator rejects, a model whose attention lets
packed examples see each other) and raises :class:`~.config.ConfigError` before anything is written.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from .checkpoints import any_process
from .config import ConfigError, LaunchConfig
from .console import is_main_process, one_line, say

__all__ = [
    "check_lora_targets",
    "check_vocabulary",
    "load_model",
    "load_tokenizer",
    "make_collator_factory",
    "probe_model",
]


def _load_auto(auto_class: Any, cfg: LaunchConfig, what: str) -> Any:
    """``auto_class.from_pretrained`` for the model of ``cfg``; :class:`ConfigError` "could not {what} of ..." if it fails."""
    name = cfg.model.model_name_or_path
    try:
        return auto_class.from_pretrained(
            name, revision=cfg.model.model_revision, trust_remote_code=cfg.training.trust_remote_code
        )
    except Exception as exc:
        raise ConfigError(f"could not {what} of {name!r}: {one_line(exc)}") from None


def load_tokenizer(cfg: LaunchConfig) -> Any:
    """The tokenizer of ``model_name_or_path`` with the ``eos_token`` / ``pad_token`` / chat template overrides."""
    from transformers import AutoTokenizer

    name = cfg.model.model_name_or_path
    tokenizer = _load_auto(AutoTokenizer, cfg, "load the tokenizer")
    training = cfg.training
    for attr in ("eos_token", "pad_token"):
        value = getattr(training, attr)
        if value is not None:
            if value not in tokenizer.get_vocab():
                raise ConfigError(f"{attr}={value!r} is not in the vocabulary of {name!r}")
            setattr(tokenizer, attr, value)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_vocabulary(cfg, tokenizer)
    if training.chat_template_path is not None:
        path = training.chat_template_path
        if not (os.path.isfile(path) and path.endswith((".jinja", ".j2"))):
            raise ConfigError(f"chat_template_path={path!r} must be an existing .jinja file")
        with open(path, encoding="utf-8") as handle:
            tokenizer.chat_template = handle.read()
    return tokenizer


def check_vocabulary(cfg: LaunchConfig, tokenizer: Any) -> None:
    """Refuse a tokenizer whose token ids do not all fit the model's embeddings (read from the model's config only).

    Such a pair fails with an IndexError at the first step that meets one of the extra tokens.
    """
    from transformers import AutoConfig

    name = cfg.model.model_name_or_path
    config = _load_auto(AutoConfig, cfg, "read the model config")
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text_config, "vocab_size", None)
    if not isinstance(size, int) or size <= 0:
        return
    vocab = tokenizer.get_vocab()
    needed = max(len(tokenizer), max(vocab.values(), default=-1) + 1)
    if needed > size:
        raise ConfigError(
            f"the tokenizer of {name!r} has {needed} token ids but the model's embeddings hold {size} (vocab_size): "
            f"use the tokenizer that belongs to this model, or resize the model's embeddings to {needed} "
            "(model.resize_token_embeddings) and save it"
        )


def check_lora_targets(cfg: LaunchConfig, model: Any) -> None:
    """With ``use_peft``: every entry of ``lora_target_modules`` must match a module of the loaded model."""
    if not cfg.model.use_peft:
        return
    import dataclasses

    from peft.tuners.tuners_utils import check_target_module_exists
    from trl import get_peft_config

    peft_config = get_peft_config(cfg.model)
    targets = peft_config.target_modules
    names = [name for name, _ in model.named_modules() if name]
    linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                     if type(module).__name__ in ("Linear", "Conv1D") and name})
    options = f"its linear layers are named {', '.join(linear[:12])}" if linear else "it has no linear layers"
    if targets is None:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

        if getattr(model.config, "model_type", None) not in DEFAULTS:
            raise ConfigError(
                f"use_peft: peft has no default LoRA targets for model type {model.config.model_type!r}: set "
                f"lora_target_modules ({options}), or all-linear"
            )
        return
    if targets == "all-linear":
        return
    entries = [targets] if isinstance(targets, str) else sorted(targets)
    unmatched = []
    for entry in entries:
        single = dataclasses.replace(peft_config, target_modules=entry if isinstance(targets, str) else [entry])
        if not any(check_target_module_exists(single, name) for name in names):
            unmatched.append(entry)
    if unmatched:
        raise ConfigError(
            f"lora_target_modules {', '.join(map(repr, unmatched))} match no module of "
            f"{cfg.model.model_name_or_path!r}; {options} (or use all-linear)"
        )


def make_collator_factory(cfg: LaunchConfig, tokenizer: Any, padding_free: bool, quiet: bool) -> Any:
    """A picklable zero-argument factory of the project's collator with the run's settings."""
    from trl_padfree.collator import DataCollatorForCompletionOnlyLM

    instruction = cfg.collator.instruction_template
    if instruction is not None and len(instruction) == 1:
        instruction = instruction[0]
    kwargs = {
        "tokenizer": tokenizer,
        "padding_free": padding_free,
        "on_template_not_found": "ignore" if quiet else "warn",
    }
    if isinstance(cfg.training.pad_to_multiple_of, int):  # padded and padding-free alike (its own segment)
        kwargs["pad_to_multiple_of"] = cfg.training.pad_to_multiple_of
    factory = functools.partial(DataCollatorForCompletionOnlyLM, cfg.collator.response_template, instruction, **kwargs)
    try:
        factory()
    except ValueError as exc:
        raise ConfigError(f"collator settings rejected: {one_line(exc)}") from None
    return factory


def load_model(cfg: LaunchConfig) -> Any:
    """Load the model (see :func:`_load_model`) and check that the LoRA targets, if any, match its modules."""
    model = _load_model(cfg)
    check_lora_targets(cfg, model)
    return model


def _load_model(cfg: LaunchConfig) -> Any:
    """Load the model with the resolved attention implementation and dtype (the ``padfree`` attention registered).

    When ``auto`` picked ``"padfree"`` and the model cannot use it (transformers fails to build it with
    ``"padfree"``, or its attention code never calls it), the model is loaded again with its own default
    attention (sdpa, else eager), ``cfg.attn_implementation`` is updated and the packing probe decides from there.
    """
    from trl_padfree.attention import ATTN_IMPLEMENTATION

    auto_padfree = cfg.attn_auto and cfg.attn_implementation == ATTN_IMPLEMENTATION
    try:
        model = _from_pretrained(cfg, cfg.attn_implementation)
    except ConfigError as exc:
        if not auto_padfree:
            raise
        return _fall_back(cfg, f"it fails to load with it ({str(exc).split(': ', 1)[-1]})")
    if auto_padfree and _materialized(model) and not _sharded_launch(cfg.training):
        from trl_padfree.probe import uses_padfree_attention

        if not uses_padfree_attention(model):
            del model
            return _fall_back(cfg, "its attention code does not go through transformers' AttentionInterface")
    return model


def _fall_back(cfg: LaunchConfig, why: str) -> Any:
    say(f"attn_implementation auto: {cfg.model.model_name_or_path} cannot use 'padfree' ({why}); loading it with "
        "its default attention instead (padding-free batches then rely on the model's own packed-sequence mask, "
        "which the packing probe checks)")
    model = _from_pretrained(cfg, None)
    cfg.attn_implementation = cfg.model.attn_implementation = model.config._attn_implementation
    say(f"attn_implementation: {cfg.attn_implementation!r}")
    return model


def _from_pretrained(cfg: LaunchConfig, attn_implementation: str | None) -> Any:
    from transformers import AutoModelForCausalLM
    from trl import get_quantization_config

    import trl_padfree.attention  # noqa: F401  (registers attn_implementation="padfree")

    model_args = cfg.model
    quantization = get_quantization_config(model_args)
    kwargs: dict[str, Any] = {
        "revision": model_args.model_revision,
        "trust_remote_code": cfg.training.trust_remote_code,
        "dtype": model_args.dtype,
    }
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if quantization is not None:
        from accelerate import PartialState

        # k-bit weights are placed at load time, one full copy per process (TRL's own scripts do the same)
        kwargs.update(quantization_config=quantization, device_map={"": PartialState().local_process_index})
    kwargs.update(cfg.model_init_kwargs or {})  # validated: no key of the launcher's own fields
    try:
        return AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)
    except Exception as exc:
        from trl_padfree.attention import load_error_reason

        reason = load_error_reason(exc, kwargs.get("attn_implementation"))
        raise ConfigError(f"could not load model {model_args.model_name_or_path!r}: {reason[:300]}") from None


def _materialized(model: Any) -> bool:
    """Whether this process holds the model's real weights (not meta tensors, not DeepSpeed ZeRO-3 shards)."""
    return all(p.device.type != "meta" and not hasattr(p, "ds_id") for p in model.parameters())


def _sharded_launch(training: Any) -> bool:
    env = os.environ
    return (
        env.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        or env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
        or bool(training.deepspeed)
        or bool(training.fsdp)
    )


def _failed_anywhere(failure: str | None) -> str | None:
    """Share a probe failure between processes, so that every rank stops (none waits in a collective)."""
    if any_process(failure is not None) and failure is None:
        return "padding-free training is unsafe for this model (the packing probe failed on another process)"
    return failure


def probe_model(model: Any, training: Any) -> None:
    """Raise :class:`ConfigError` if packed examples leak under the model's attention implementation.

    Judged at the training precision (bf16/fp16 mixed precision gets that dtype's tolerance), on the training
    device where the Trainer would put the model anyway. A process that holds no real weights (FSDP loading on
    rank 0 only, DeepSpeed ZeRO-3 shards) skips the probe; any process's failure stops every process.
    """
    from trl_padfree.probe import PackingLeakError, assert_packing_safe, training_rtol

    failure = None
    if _materialized(model):
        quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
        if training.device.type != "cpu" and not quantized and not _sharded_launch(training):
            model.to(training.device)
        try:
            report = assert_packing_safe(model, rtol=training_rtol(training))
        except PackingLeakError as exc:
            headline = str(exc.report).splitlines()[0]
            failure = f"padding-free training is unsafe for this model: {headline} {exc.report.advice}"
        else:
            from trl_padfree.trainer import probe_passed_line

            if is_main_process():
                print(probe_passed_line(report), flush=True)
    else:
        say("packing probe skipped: the weights are sharded at load time here (DeepSpeed ZeRO-3 / FSDP); check the "
            "model once with `trl-padfree check --model NAME`")
    failure = _failed_anywhere(failure)
    if failure is not None:
        raise ConfigError(failure)
