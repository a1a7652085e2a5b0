"""What a trainer of the launch provides: :class:`Task`, whose methods the stages of a run (:mod:`..run`) call in
turn. This module imports nothing of the launch (the stages import it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Records", "Task", "first_last", "say_data"]


@dataclass
class Records:
    """A task's prepared data: the splits as the trainer takes them, and what the checks found."""

    train: Any
    eval: Any | None
    text_format: str
    dropped: dict[str, int] = field(default_factory=dict)  # records TRL's trainer dropped, per split
    paired: bool = False  # KTO: preference pairs, which TRL unpairs


def say_data(data: Any, unit: str, extra: str = "", eval_unit: str | None = None) -> None:
    """The run's line about its data: ``data: N training <unit>, M eval <unit> (format: ...<extra>)``."""
    from ..console import say

    say(f"data: {len(data.train)} training {unit}" + (f", {len(data.eval)} eval {eval_unit or unit}"
                                                      if data.eval is not None else "")
        + f" (format: {data.text_format}{extra})")


def first_last(evals: list[dict[str, Any]], key: str, name: str = "") -> str | None:
    """``"<name>first -> last"`` of ``key`` over the log entries ``evals`` (None where either lacks it: TRL logs a
    figure only when an evaluation batch had what it needs)."""
    if not evals or key not in evals[0] or key not in evals[-1]:
        return None
    return f"{name}{evals[0][key]:.3f} -> {evals[-1][key]:.3f}"


class Task:
    """One trainer of the launch (subclass it; see :mod:`trl_padfree.launch.tasks`).

    ``name``: the registry key; ``command``: the ``trl-padfree`` sub-command; ``trainer_name``: TRL's trainer class
    name (its config class and the one-line errors of its constructor); ``arguments``: the launch's arguments of
    this trainer (None: ``config.LaunchArguments``).
    """

    name: str = ""
    command: str = ""
    trainer_name: str = ""
    arguments: type | None = None

    @property
    def prog(self) -> str:
        return f"trl-padfree {self.command}"

    ranges: dict[str, Any] = {}  # legal ranges (validate.Range) of the task's fields beyond validate.NUMERIC_RANGES

    def check(self, cfg: Any) -> None:
        """The task's own checks (raise ``ConfigError``), before the model and output_dir checks; change nothing."""

    def resolve(self, cfg: Any) -> dict[str, Any]:
        """The fields of the ``LaunchConfig`` to change once every check passed (``cfg`` is not changed)."""
        return {}

    def describe(self, cfg: Any) -> dict[str, Any]:
        """The task's own fields of the run line."""
        return {}

    unit = "examples"  # a record, in the data line

    def load_data(self, cfg: Any, tokenizer: Any) -> Any:
        """The prepared data: an object with ``train``, ``eval`` (or None) and ``text_format``."""
        raise NotImplementedError

    def prepare_data(self, cfg: Any, tokenizer: Any) -> Any:
        data = self.load_data(cfg, tokenizer)
        say_data(data, self.unit)
        return data

    def probe_check(self, cfg: Any) -> Any:
        """The probe the launch runs before anything is written (None: SFT's ``assert_packing_safe``)."""
        return None

    def model_class(self) -> Any:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM

    def trainer_kwargs(self, cfg: Any) -> dict[str, Any]:
        """``scored_lm_head`` where the task's config has it (the trainers with an LM head)."""
        if not hasattr(cfg.training, "scored_lm_head"):
            return {}
        return {"scored_lm_head": bool(cfg.training.scored_lm_head)}

    def check_trainer(self, cfg: Any, trainer: Any, data: Any) -> None:
        """Checks of the built trainer before anything is written (e.g. what TRL dropped); raise ``ConfigError``."""

    def load_reference(self, cfg: Any) -> tuple[Any, str | None]:
        """The reference model (or None) and the line that says which (None: no line)."""
        return None, None

    def make_trainer(self, cfg: Any, tokenizer: Any, model: Any, ref_model: Any, data: Any,
                     callbacks: Sequence[Any]) -> Any:
        raise NotImplementedError

    def summary_settings(self, cfg: Any) -> dict[str, Any]:
        """The task's own settings in ``launch_summary.json`` (those of the run line)."""
        return self.describe(cfg)

    def summary_lines(self, lines: list[str], history: list[dict[str, Any]]) -> list[str]:
        """The summary's lines for this task (given the shared ones and the log history)."""
        return lines

    def preview(self, cfg: Any, tokenizer: Any, n: int, color: bool) -> list[str]:
        """``trl-padfree preview``'s lines for the first ``n`` records."""
        raise NotImplementedError
