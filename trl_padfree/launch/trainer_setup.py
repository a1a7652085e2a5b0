"""How the launch builds every trainer: the task's trainer class with :class:`LaunchTrainer` first."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from .callbacks import CheckpointMarker

__all__ = ["LaunchTrainer", "make_launch_trainer"]


class LaunchTrainer:
    """Adds the launch's :class:`~.callbacks.CheckpointMarker` (``checkpoint_marker``, whose ``run_id`` the run
    sets), after the run's own callbacks (a stop is seen)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.checkpoint_marker = CheckpointMarker()
        self.add_callback(self.checkpoint_marker)  # type: ignore[attr-defined]

    @property
    def first_step(self) -> int | None:
        """The global step this process started training from (> 0 after a resume)."""
        return self.checkpoint_marker.first_step


@functools.cache
def launch_class(trainer_class: type) -> type:
    """``class Launch<Name>(LaunchTrainer, trainer_class)``."""
    return type(f"Launch{trainer_class.__name__}", (LaunchTrainer, trainer_class), {})


def make_launch_trainer(trainer_class: type, cfg: Any, tokenizer: Any, model: Any, data: Any,
                        callbacks: Sequence[Any], **own: Any) -> Any:
    """The launch's ``trainer_class`` built from the run; no packing check or thread policy of its own (the launch
    did both). ``own``: the trainer's own arguments."""
    from trl import get_peft_config

    from .config import with_fields

    args = with_fields(cfg.training, check_packing=False, torch_num_threads=None)
    return launch_class(trainer_class)(model=model, args=args, train_dataset=data.train, eval_dataset=data.eval,
                                       processing_class=tokenizer, peft_config=get_peft_config(cfg.model),
                                       callbacks=list(callbacks), **own)
