"""The launch's trainers, one recipe module each, read top to bottom as TRL's ``trl/scripts``: ``ARGUMENTS`` (its
:class:`~..config.LaunchArguments`), ``CONFIG``, ``TRAINER``, ``check(cfg)`` where it has refusals (before anything
loads), ``settings(cfg)`` (its fields of the run line; default: ``prompt_once``), ``run(cfg, callbacks)`` (the steps
of :mod:`..steps`; returns the summary) and ``preview(cfg, tokenizer, n, color)``. A new trainer is one module here
and one line in :data:`COMMANDS`.

>>> get_task("dpo").TRAINER.__name__, prog("sft")
('DPOTrainer', 'trl-padfree train')
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: Recipe (a module of this package) -> its ``trl-padfree`` sub-command.
COMMANDS = {"sft": "train", "dpo": "dpo", "grpo": "grpo", "rloo": "rloo", "reward": "reward", "kto": "kto"}


def get_task(name: str) -> ModuleType:
    """The recipe module ``name``, imported on first use (``trl-padfree --help`` stays fast)."""
    return importlib.import_module(f"{__name__}.{name}")


def prog(name: str) -> str:
    return f"trl-padfree {COMMANDS[name]}"
