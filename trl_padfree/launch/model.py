"""The model of a run: loaded with the resolved attention and dtype, LoRA targets checked; a failure is a
:class:`~.config.ConfigError` before anything is written."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from .config import ConfigError, LaunchConfig
from .console import say

__all__ = ["check_lora_targets", "load_model", "materialized", "sharded_launch"]


def check_lora_targets(cfg: LaunchConfig, model: Any) -> None:
    """With ``use_peft``: every entry of ``lora_target_modules`` must match a module of the loaded model."""
    if not cfg.model.use_peft:
        return

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


def load_model(cfg: LaunchConfig, auto_class: Any = None) -> tuple[Any, LaunchConfig]:
    """``(model, cfg with the attention it was loaded with)``, the LoRA targets checked; ``auto_class``: default
    ``AutoModelForCausalLM`` (a reward model: a sequence classifier with one output)."""
    model, cfg = _load_model(cfg, auto_class)
    check_lora_targets(cfg, model)
    return model, _shared_prompt_default(cfg, model)


def _shared_prompt_default(cfg: LaunchConfig, model: Any) -> LaunchConfig:
    """An unset ``prompt_once`` (GRPO, RLOO: on where it can run) is off for a model with recurrent layers, which a
    prompt shared through the attention's key index cannot reach (:func:`trl_padfree.recurrent.refuse_shared_prompt`);
    one set to true is refused here, in one line (:class:`ConfigError`), before the probe runs."""
    from trl_padfree.recurrent import recurrent_layer_types, refuse_shared_prompt

    if getattr(cfg.training, "prompt_once", False):
        try:
            refuse_shared_prompt(model, "prompt_once: true")
        except ValueError as exc:  # before the probe, whose advice would be about padding_free
            raise ConfigError(str(exc)) from None
    if "prompt_once" in cfg.explicit or cfg.task not in ("grpo", "rloo"):
        return cfg
    layers = recurrent_layer_types(model)
    if not layers:
        return cfg
    say(f"prompt_once: off ({layers[0]} layers cannot share a prompt's state through the attention's key index)")
    cfg.explicit, cfg.training.prompt_once = cfg.explicit | {"prompt_once"}, False
    return cfg


def _load_model(cfg: LaunchConfig, auto_class: Any) -> tuple[Any, LaunchConfig]:
    """Load the model with the resolved attention and dtype; when ``auto`` picked ``"padfree"`` and the model cannot
    use it, again with its own default attention (:mod:`trl_padfree.attn_fallback`)."""
    from transformers import AutoModelForCausalLM, set_seed
    from trl import get_quantization_config

    import trl_padfree.attention  # noqa: F401  (registers attn_implementation="padfree")
    from trl_padfree.attn_fallback import ModelLoadError, load_with_fallback

    model_args = cfg.model
    quantization = get_quantization_config(model_args)
    kwargs: dict[str, Any] = dict(revision=model_args.model_revision, dtype=model_args.dtype,
                                  trust_remote_code=cfg.training.trust_remote_code)
    if quantization is not None:
        from accelerate import PartialState

        # k-bit weights are placed at load time, one full copy per process (TRL's own scripts do the same)
        kwargs.update(quantization_config=quantization, device_map={"": PartialState().local_process_index})
    kwargs.update(cfg.model_init_kwargs or {})  # validated: no key of the launcher's own fields
    auto_class = auto_class or AutoModelForCausalLM

    def load(attn_implementation: str | None) -> Any:
        attn = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
        set_seed(cfg.training.seed)  # a head the checkpoint lacks (a reward model's score) starts the same every run
        return auto_class.from_pretrained(model_args.model_name_or_path, **attn, **kwargs)

    fell_back = []

    def announce(why: str) -> None:
        fell_back.append(why)
        say(f"attn_implementation auto: {model_args.model_name_or_path} cannot use 'padfree' ({why}); loading it "
            "with its default attention instead (padding-free batches then rely on the model's own packed-sequence "
            "mask, which the packing probe checks)")

    try:
        model = load_with_fallback(
            load, cfg.attn_implementation, auto=cfg.attn_auto, on_fallback=announce,
            inspect=lambda model: materialized(model) and not sharded_launch(cfg.training),
        )  # fmt: skip
    except ModelLoadError as exc:
        raise ConfigError(f"could not load model {model_args.model_name_or_path!r}: {str(exc)[:300]}") from None
    if fell_back:
        cfg.model.attn_implementation = attn = model.config._attn_implementation
        say(f"attn_implementation: {attn!r}")
    return model, cfg


def materialized(model: Any) -> bool:
    """Whether this process holds the model's real weights (not meta tensors, not DeepSpeed ZeRO-3 shards)."""
    return all(p.device.type != "meta" and not hasattr(p, "ds_id") for p in model.parameters())


def sharded_launch(training: Any) -> bool:
    """Whether the run shards the weights at load time (FSDP or DeepSpeed, from accelerate's launcher or the config)."""
    return bool(training.deepspeed or training.fsdp) or any(
        os.environ.get(f"ACCELERATE_USE_{name}", "false").lower() == "true" for name in ("FSDP", "DEEPSPEED"))
