"""The launch's Trainer callbacks (public ``TrainerCallback`` hooks only): the SIGTERM / Ctrl-C stop with a
checkpoint, and the checkpoint completion marker (with a loss log at every checkpoint and at the last step)."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

from accelerate import PartialState
from transformers import TrainerCallback

from .distributed import gather, in_process_group
from .resume import CHECKPOINT_MARKER, write_json


class GracefulStop(TrainerCallback):
    """Around ``trainer.train()``: save a checkpoint and stop at the end of the step in which SIGTERM or SIGINT
    arrived (every rank at the same step); a second signal acts as if this were not there."""

    def __init__(self, announce: Any = None) -> None:
        self.requested: str | None = None  # name of the signal received
        self.stopped_at: int | None = None  # global step at which training was stopped
        self._announce = announce or (lambda message: None)
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:  # second signal: the previous handler takes it (SIGINT: KeyboardInterrupt)
            self.__exit__()
            signal.raise_signal(signum)
            return
        self.requested = name
        self._announce(f"{name} received: saving a checkpoint at the end of this step, then stopping "
                       "(send it again to abort at once)")

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        names = gather(self.requested)  # every rank stops at the same step
        if any(names):
            if in_process_group():
                self.requested = ", ".join(f"{name} on rank {rank}" for rank, name in enumerate(names) if name)
            control.should_save = control.should_training_stop = True
            self.stopped_at = state.global_step
        return control


class NothingToTrain(Exception):
    """Training resumed at its last step (``trainer.train()`` would train a step past it), weights loaded."""


class CheckpointMarker(TrainerCallback):
    """Mark ``checkpoint-N`` complete once every process saved its part: the run id, the step and each file's size,
    synced (:mod:`.resume`). Logs the loss at every checkpoint and the last step (a checkpoint's log history covers
    every step); ``first_step``: the step this process started from. Raises :class:`NothingToTrain`."""

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id, self.first_step = run_id, None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.first_step = state.global_step
        if 0 < state.max_steps <= state.global_step:
            raise NothingToTrain

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_save or control.should_training_stop:
            control.should_log = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        PartialState().wait_for_everyone()  # every rank's files (RNG states, shards) are written
        if not args.should_save:
            return
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        files = {}
        for root, _, names in os.walk(path):
            for name in names:
                full = os.path.join(root, name)
                with open(full, "rb") as handle:
                    os.fsync(handle.fileno())
                files[os.path.relpath(full, path)] = os.path.getsize(full)
        files.pop(CHECKPOINT_MARKER, None)
        write_json(os.path.join(path, CHECKPOINT_MARKER), {"run_id": self.run_id, "step": state.global_step,
                                                            "files": files})
