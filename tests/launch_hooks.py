"""Test-only fault injection for ``trl-padfree train`` runs (never imported by the package).

Trainer callbacks handed to :func:`trl_padfree.launch.main` (``main(argv, callbacks=[...])``), and a command-line
entry for runs in a subprocess::

    python tests/launch_hooks.py [--sigterm-at-step K] [--sigkill-in-save-at-step K] -- TRAIN ARGUMENTS

- :class:`SigtermAtStep`: the process sends itself SIGTERM at the end of optimizer step K (the launcher's
  SIGTERM handling then saves a checkpoint and stops).
- :class:`SigkillInSave`: SIGKILL while the checkpoint of step K is being written: after the model weights,
  when the Trainer asks the optimizer for its state (so no optimizer, scheduler or trainer state is on disk).
- :class:`FailEvaluation`: every evaluation raises.
- :class:`FullDiskAtEnd`: when training ends, the filesystem of ``output_dir`` fills up (a tmpfs filled with a
  ballast file: real ENOSPC), or, where no tmpfs can be mounted, the file-size limit drops (RLIMIT_FSIZE: real
  EFBIG); either way the final save fails in the kernel, not in a mock.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from typing import Any

from transformers import TrainerCallback


class SigtermAtStep(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class SigkillInSave(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        if state.global_step == self.step and control.should_save:

            def killed(*a: Any, **k: Any) -> Any:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)

            optimizer.state_dict = killed


class FailAtStep(TrainerCallback):
    """Training raises at the end of optimizer step K (after that step's checkpoint, if any, was saved)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._check(state)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not control.should_save:
            self._check(state)

    def _check(self, state: Any) -> None:
        if state.global_step == self.step:
            raise RuntimeError(f"training failed on purpose at step {self.step} (tests/launch_hooks.py)")


class FailEvaluation(TrainerCallback):
    """Every evaluation fails (raised from the Trainer's ``on_evaluate`` event)."""

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        raise RuntimeError("evaluation failed on purpose (tests/launch_hooks.py)")


class FullDiskAtEnd(TrainerCallback):
    """Fill the disk of ``ballast`` (a path on a small tmpfs), or with ``ballast=None`` lower RLIMIT_FSIZE.

    At the end of training, or with ``at_step=K`` at the end of step K (before that step's checkpoint is saved).
    """

    def __init__(self, ballast: str | None, fsize_limit: int = 64 * 1024, at_step: int | None = None) -> None:
        self.ballast = ballast
        self.fsize_limit = fsize_limit
        self.at_step = at_step
        self.previous: tuple[int, int] | None = None
        self.previous_handler: Any = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.at_step:
            self.fill()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.at_step is None:
            self.fill()

    def fill(self) -> None:
        if self.ballast is None:
            self.previous = resource.getrlimit(resource.RLIMIT_FSIZE)
            self.previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.fsize_limit, self.previous[1]))
            return
        with open(self.ballast, "wb") as handle:
            try:
                while True:
                    handle.write(b"\0" * (1 << 20))
                    handle.flush()
            except OSError:
                pass

    def restore(self) -> None:
        """Undo the file-size limit (in-process runs)."""
        if self.previous is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, self.previous)
            signal.signal(signal.SIGXFSZ, self.previous_handler)
            self.previous = None


def _main(argv: list[str]) -> int:
    from trl_padfree.launch import main

    split = argv.index("--")
    hooks, train_argv = argv[:split], argv[split + 1 :]
    callbacks: list[Any] = []
    for flag, value in zip(hooks[::2], hooks[1::2], strict=True):
        kind = {"--sigterm-at-step": SigtermAtStep, "--sigkill-in-save-at-step": SigkillInSave}[flag]
        callbacks.append(kind(int(value)))
    return main(train_argv, callbacks=callbacks)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
