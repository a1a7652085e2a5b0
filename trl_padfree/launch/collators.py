"""The collator of ``trl-padfree train`` and ``preview``: a factory of the project's collator with the run's settings.

A setting the collator rejects (a template it cannot use, say) is bad input and raises
:class:`~.config.ConfigError` when the factory is made, before anything is written.
"""

from __future__ import annotations

import functools
from typing import Any

from .config import ConfigError, LaunchConfig
from .console import one_line

__all__ = ["make_collator_factory"]


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
