"""What several tasks share: ``prompt_once``'s requirements (:class:`PromptOnceTask`), the reference model and the
preference probe of ``dpo`` and ``kto``. A task module imports this one and :mod:`.base`, not another task's."""

from __future__ import annotations

from functools import partial
from typing import Any

from ..config import ChatArguments, ConfigError
from .base import Task

__all__ = ["PreferenceTask", "PromptOnceTask"]


class PromptOnceTask(Task):
    """A task whose trainer has ``prompt_once`` (DPO, KTO, reward, GRPO, RLOO): it needs the flat row and the
    ``"padfree"`` attention, which the launch then pins; the run line and the summary name it."""

    probe_layout = "preference"  # the layout trl_padfree.probe.assert_layout_packing_safe checks before training

    def prompt_once(self, cfg: Any) -> bool:
        return bool(cfg.training.prompt_once)

    def check(self, cfg: Any) -> None:
        if not cfg.training.prompt_once:
            return
        if not cfg.padding_free:
            raise ConfigError("prompt_once: true needs padding_free: true (the prompt is shared inside the flat row)")
        if cfg.attn_implementation not in ("auto", "padfree"):
            raise ConfigError(
                f"prompt_once: true needs attn_implementation 'padfree' (it alone reads the shared prompt keys), got "
                f"{cfg.attn_implementation!r}: use auto or padfree")

    def resolve(self, cfg: Any) -> dict[str, Any]:
        return {"attn_implementation": "padfree"} if cfg.training.prompt_once else {}

    def probe_check(self, cfg: Any) -> Any:
        from ...probe import assert_layout_packing_safe

        return partial(assert_layout_packing_safe, layout=self.probe_layout, prompt_once=self.prompt_once(cfg))

    def describe(self, cfg: Any) -> dict[str, Any]:
        return {"prompt_once": self.prompt_once(cfg)}


class PreferenceTask(PromptOnceTask):
    """DPO and KTO: chat records (``chat_template_path``), the preference probe and a reference model (None with
    ``use_peft``: TRL switches the adapters off)."""

    arguments = ChatArguments

    def load_reference(self, cfg: Any) -> tuple[Any, str | None]:
        if cfg.model.use_peft:
            return None, "reference model: the policy with its LoRA adapters switched off"
        from ..model import load_model

        return load_model(cfg)[0], "reference model: a second copy of the starting weights"
