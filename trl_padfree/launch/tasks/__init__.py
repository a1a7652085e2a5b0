"""The trainers of the launch, one :class:`~.base.Task` per module; the stages of a run call the task.

``trl-padfree train`` is the ``"sft"`` task, ``trl-padfree dpo`` the ``"dpo"`` task, ``trl-padfree grpo`` /
``trl-padfree rloo`` the ``"grpo"`` / ``"rloo"`` tasks, ``trl-padfree reward`` / ``trl-padfree kto`` the ``"reward"`` /
``"kto"`` tasks. A new trainer is one module here holding a ``TASK`` object
and one line in :data:`REGISTRY` (or :func:`register` at run time, as the tests do).

>>> get_task("dpo").prog
'trl-padfree dpo'
>>> sorted(REGISTRY)
['dpo', 'grpo', 'kto', 'reward', 'rloo', 'sft']
"""

from __future__ import annotations

import importlib

from .base import Task

__all__ = ["REGISTRY", "Task", "get_task", "register", "task_names"]

#: Task name -> the module that holds its ``TASK`` (imported on first use: the CLI's help stays fast), then the task.
REGISTRY: dict[str, str | Task] = {
    "sft": "trl_padfree.launch.tasks.sft",
    "dpo": "trl_padfree.launch.tasks.dpo",
    "grpo": "trl_padfree.launch.tasks.grpo",
    "rloo": "trl_padfree.launch.tasks.rloo",
    "reward": "trl_padfree.launch.tasks.reward",
    "kto": "trl_padfree.launch.tasks.kto",
}


def register(task: Task) -> Task:
    """Add (or replace) ``task`` under ``task.name``; returns it."""
    if not isinstance(task, Task):
        raise TypeError(f"register() takes a launch Task, got {type(task).__name__}")
    REGISTRY[task.name] = task
    return task


def get_task(name: str | Task) -> Task:
    """The task called ``name`` (a :class:`Task` is returned as it is)."""
    if isinstance(name, Task):
        return name
    if name not in REGISTRY:
        raise ValueError(f"unknown launch task {name!r}; known: {', '.join(sorted(REGISTRY))}")
    task = REGISTRY[name]
    if isinstance(task, str):
        task = REGISTRY[name] = importlib.import_module(task).TASK
    return task


def task_names() -> list[str]:
    """The registered task names, in registration order."""
    return list(REGISTRY)
