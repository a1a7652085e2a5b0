"""The model of a run: loaded with the resolved attention and dtype, LoRA targets checked; a failure is a
:class:`~.config.ConfigError` before anything is written."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from .config import ConfigError, LaunchConfig
from .console import say

__all__ = ["check_lora_targets", "load_model", "materialized", "sharded_launch"]


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
