"""What a launched trainer records so that the run's summary covers the whole run, also after a resume.

:class:`WholeRunLog` (a mixin before the trainer class) remembers the global step this process started from and
logs the training loss at every checkpoint and at the last step, so that the log history saved with a checkpoint
holds every step's loss (:func:`~.summary.run_train_loss` reads it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["WholeRunLog"]


class WholeRunLog:
    """Mixin for a ``transformers.Trainer`` subclass (see the module docstring)."""

    first_step: int | None = None  # the global step this process started from (> 0 after a resume)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.first_step is None:
            self.first_step = self.state.global_step
        return super().training_step(*args, **kwargs)

    def _maybe_log_save_evaluate(self, *args: Any, **kwargs: Any) -> None:
        # a checkpoint or the last step: log the training loss first, so that every step's loss is in the log
        # history (saved with the checkpoint) and a resumed run's summary covers the whole run
        if self.control.should_save or self.control.should_training_stop:
            self.control.should_log = True
        return super()._maybe_log_save_evaluate(*args, **kwargs)
