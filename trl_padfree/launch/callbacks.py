"""Trainer callbacks of ``trl-padfree train``: stop cleanly on SIGTERM / Ctrl-C with a checkpoint.

:class:`GracefulStop` installs handlers for SIGTERM and SIGINT while training runs. The first signal only sets a
flag; at the end of the current optimizer step the callback asks the Trainer to save a checkpoint and stop, so
``--resume_from_checkpoint`` continues from exactly that step (model, optimizer, scheduler, RNG states and data
order are all restored by the Trainer). A second signal restores the default handler's behaviour (Ctrl-C twice
aborts at once). Under several processes the flag is shared (an all-reduce per step), so every rank stops at the
same step even if only one got the signal.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from transformers import TrainerCallback

__all__ = ["GracefulStop"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulStop(TrainerCallback):
    """Save a checkpoint and stop training at the end of the step during which SIGTERM or SIGINT arrived.

    Use as a context manager around ``trainer.train()`` so the handlers are installed only while training::

        stop = GracefulStop()
        trainer.add_callback(stop)
        with stop:
            trainer.train()
        if stop.stopped_at is not None: ...
    """

    def __init__(self, announce: Any = None) -> None:
        self.requested: str | None = None  # name of the signal received
        self.stopped_at: int | None = None  # global step at which training was stopped
        self._announce = announce or (lambda message: None)
        self._previous: dict[int, Any] = {}

    # ------------------------------------------------------------------ signal handling
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:  # second signal: behave as if we were not there
            self._restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.raise_signal(signum)
            return
        self.requested = name
        self._announce(f"{name} received: saving a checkpoint at the end of this step, then stopping "
                       "(send it again to abort at once)")

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    # ------------------------------------------------------------------ trainer hooks
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        from .collective import any_process

        if any_process(self.requested is not None):  # every rank stops at the same step
            self.requested = _who_was_signalled(self.requested)
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
        return control


def _who_was_signalled(mine: str | None) -> str:
    """Every rank's words for the stop, the same on each (``SIGTERM on rank 1``); a single process: its signal."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return mine or "a signal"
    from .rendezvous import gather_reports

    return ", ".join(f"{name} on rank {rank}" for rank, _, name in gather_reports(mine))
