"""What a trainer of the launch provides: :class:`Task`, whose methods the stages of a run call in turn.

The stages (:mod:`..config` -> :mod:`..validate` -> :mod:`..defaults` -> data -> :mod:`..model` -> :mod:`..probe_stage`
-> train -> :mod:`..summary`) hold what every trainer shares (YAML parsing, strict keys and types, output_dir,
resume, attention choice, atomic checkpoints, SIGTERM stop, multi-process start and exit, the run line); a task
holds what is its own, one method per stage. This module imports nothing of the launch (the stages import it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["Task"]


class Task:
    """One trainer of the launch (subclass it; see :mod:`trl_padfree.launch.tasks`).

    Attributes:
        name: the registry key (``LaunchConfig.task``).
        command: the ``trl-padfree`` sub-command (``prog`` is ``"trl-padfree " + command``).
        trainer_name: TRL's trainer class name, for the one-line errors of its constructor's checks.
    """

    name: str = ""
    command: str = ""
    trainer_name: str = ""
    arguments: type | None = None  # the launch's arguments of this trainer (None: config.LaunchArguments)

    @property
    def prog(self) -> str:
        return f"trl-padfree {self.command}"

    # -- validate -------------------------------------------------------------------------------------------------
    def numeric_ranges(self) -> dict[str, Any]:
        """Legal ranges (``validate.Range``) of this task's fields that differ from ``validate.NUMERIC_RANGES``."""
        return {}

    def check(self, cfg: Any) -> None:
        """The task's own checks (raise ``ConfigError``; ``cfg.padding_free`` is resolved), before the model and
        output_dir checks; they change nothing (:meth:`resolve` does)."""

    def resolve(self, cfg: Any) -> dict[str, Any]:
        """The task's settings resolved once every check passed: the fields of the ``LaunchConfig`` to change and
        their new values (a nested object as a copy, ``config.with_fields``); ``cfg`` is not changed."""
        return {}

    def describe(self, cfg: Any) -> dict[str, Any]:
        """The task's own fields of the run line, after ``padding_free``."""
        return {}

    # -- data, model, probe, trainer ------------------------------------------------------------------------------
    def prepare_data(self, cfg: Any, tokenizer: Any) -> Any:
        """The prepared data: an object with ``train`` and ``eval`` (or None) datasets."""
        raise NotImplementedError

    def probe_check(self, cfg: Any) -> Any:
        """The probe the launch runs before anything is written (None: SFT's ``assert_packing_safe``)."""
        return None

    def model_class(self) -> Any:
        """The ``transformers`` auto class the launch loads the model with (:mod:`..model`; default a causal LM)."""
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM

    def model_kwargs(self, cfg: Any) -> dict[str, Any]:
        """Extra ``from_pretrained`` arguments of this task's model (e.g. ``num_labels``; default none)."""
        return {}

    def trainer_kwargs(self, cfg: Any) -> dict[str, Any]:
        """The shared launcher settings for ``make_trainer`` to pass on to the trainer: ``scored_lm_head`` where the
        task's config has it (the trainers with an LM head), else none."""
        if not hasattr(cfg.training, "scored_lm_head"):
            return {}
        return {"scored_lm_head": bool(cfg.training.scored_lm_head)}

    def check_trainer(self, cfg: Any, trainer: Any, data: Any) -> None:
        """Checks of the trainer once built, before anything is written (e.g. what TRL dropped); raise
        ``ConfigError``."""

    def load_reference(self, cfg: Any) -> tuple[Any, str | None]:
        """The reference model (or None) and the line that says which (None: no line)."""
        return None, None

    def make_trainer(self, cfg: Any, tokenizer: Any, model: Any, ref_model: Any, data: Any,
                     callbacks: Sequence[Any]) -> Any:
        """The trainer, with the launch's atomic checkpoints and whole-run log (the probe already ran)."""
        raise NotImplementedError

    # -- summary, preview -----------------------------------------------------------------------------------------
    def summary_settings(self, cfg: Any) -> dict[str, Any]:
        """The task's own settings in ``launch_summary.json``."""
        return {}

    def summary_lines(self, lines: list[str], history: list[dict[str, Any]]) -> list[str]:
        """The summary's lines for this task (given the shared ones and the log history)."""
        return lines

    def preview(self, cfg: Any, tokenizer: Any, n: int, color: bool) -> list[str]:
        """``trl-padfree preview``'s lines for the first ``n`` records."""
        raise NotImplementedError
