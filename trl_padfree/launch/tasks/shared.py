"""What several tasks share, and no task owns: ``prompt_once``'s
requirements, the reference model and the preference probe of ``dpo`` and ``kto`` (their records:
:mod:`.preference_data`; the launch trainers' mixins and construction are in :mod:`..trainer_setup`). A task module
imports this module, :mod:`.preference_data` and :mod:`.base`, never another task's module (except a variant of it:
:mod:`.rloo` is :mod:`.grpo` with TRL's other config).
"""

from __future__ import annotations

from typing import Any

from ..config import ConfigError

__all__ = [
    "check_prompt_once",
    "pin_prompt_once",
    "preference_probe",
    "reference_model",
]


def check_prompt_once(cfg: Any) -> None:
    """``prompt_once`` needs the flat row and the ``"padfree"`` attention (pinned by :func:`pin_prompt_once`)."""
    if not cfg.training.prompt_once:
        return
    if not cfg.padding_free:
        raise ConfigError("prompt_once: true needs padding_free: true (the prompt is shared inside the flat row)")
    if cfg.attn_implementation not in ("auto", "padfree"):
        raise ConfigError(
            f"prompt_once: true needs attn_implementation 'padfree' (it alone reads the shared prompt keys), got "
            f"{cfg.attn_implementation!r}: use auto or padfree")


def pin_prompt_once(cfg: Any) -> dict[str, Any]:
    """A task's resolution of ``prompt_once: true``: the ``"padfree"`` attention (:func:`check_prompt_once`)."""
    return {"attn_implementation": "padfree"} if cfg.training.prompt_once else {}


def reference_model(cfg: Any) -> tuple[Any, str]:
    """The reference model: a second copy of the starting weights, or None with ``use_peft`` (the adapters are
    switched off instead, as TRL does); and the line that says which."""
    if cfg.model.use_peft:
        return None, "reference model: the policy with its LoRA adapters switched off"
    from ..model import load_model

    return load_model(cfg)[0], "reference model: a second copy of the starting weights"


def preference_probe(cfg: Any) -> Any:
    """The preference probe the launch runs on the policy before anything is written (:func:`..probe.probe_model`)."""
    from functools import partial

    from trl_padfree.preference_probe import assert_preference_packing_safe

    return partial(assert_preference_packing_safe, prompt_once=bool(cfg.training.prompt_once))
