"""Test-only fault injection for ``trl-padfree train`` runs (never imported by the package).

Trainer callbacks handed to :func:`trl_padfree.launch.main` (``main(argv, callbacks=[...])``), and the one
command-line entry for runs in a subprocess, alone or as each rank of a multi-process launcher::

    python tests/launch_hooks.py [--rank R] [--attempt N] FAULT... -- TRAIN ARGUMENTS
    python -m torch.distributed.run ... tests/launch_hooks.py --rank 1 --fail-in-step 2 -- TRAIN ARGUMENTS

Faults (each takes the optimizer step K at which it strikes):

- ``--sigterm-at-step K`` (:class:`SigtermAtStep`): the process sends itself SIGTERM at the end of step K (the
  launcher's SIGTERM handling then saves a checkpoint and stops).
- ``--sigkill-at-step K`` (:class:`SigkillAtStep`): SIGKILL at the end of step K (mid-run, no save under way).
- ``--sigkill-in-save-at-step K`` (:class:`SigkillInSave`): SIGKILL while the checkpoint of step K is being
  written: at the process's first ``torch.save`` of that checkpoint, i.e. after the model weights on the process
  that saves them (no optimizer, scheduler or trainer state on disk), or at its RNG state on a process that writes
  nothing else.
- ``--fail-in-step K`` (:class:`FailInStep`): step K raises before its forward pass (the other ranks are then
  inside that step's gradient all-reduce, the worst place to be left waiting).
- ``--full-disk-at-step K`` (:class:`FullDiskAtEnd`): at the end of step K (before its checkpoint), the
  file-size limit drops to ``--fsize-limit`` bytes (RLIMIT_FSIZE: real EFBIG from the kernel), or with
  ``--ballast PATH`` (a file on a small tmpfs) the filesystem fills up (real ENOSPC).
- ``--sigstop-at-step K`` (:class:`SigstopAtStep`): the process stops itself (SIGSTOP) at the end of step K, as a
  node that hangs; only SIGCONT or SIGKILL from outside ends it.

``--task dpo``: the run is ``trl-padfree dpo`` (default ``sft``: ``trl-padfree train``).
``--rank R``: only the process whose ``RANK`` is R (default: every process). ``--attempt N``: only in torchrun's
restart N (``TORCHELASTIC_RESTART_COUNT``; default 0, so that a restarted worker runs clean).

In-process only: :class:`FailAtStep` (raises at the end of step K, after its checkpoint) and
:class:`FailEvaluation` (every evaluation raises).
"""

from __future__ import annotations

import argparse
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


def _kill_now(sig: int = signal.SIGKILL) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), sig)


class SigkillAtStep(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            _kill_now()


class SigstopAtStep(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            _kill_now(signal.SIGSTOP)


class SigkillInSave(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step and control.should_save:
            import torch

            def killed(*a: Any, **k: Any) -> Any:
                _kill_now()

            torch.save = killed  # the Trainer's optimizer, scheduler and RNG-state files go through torch.save


class FailInStep(TrainerCallback):
    """Step K raises at its beginning (before the forward pass of its first micro-batch)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step + 1 == self.step:
            raise RuntimeError(f"injected failure on rank {os.environ.get('RANK', '0')} at step {self.step}")


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


_FAULTS = {
    "--sigterm-at-step": SigtermAtStep,
    "--sigkill-at-step": SigkillAtStep,
    "--sigkill-in-save-at-step": SigkillInSave,
    "--sigstop-at-step": SigstopAtStep,
    "--fail-in-step": FailInStep,
}


def _main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else -1  # torchrun drops a "--" that follows the script at once
    parser = argparse.ArgumentParser(prog="tests/launch_hooks.py")
    parser.add_argument("--rank", type=int, help="only this rank (RANK); default every rank")
    parser.add_argument("--attempt", type=int, default=0, help="only in this torchrun restart (default 0)")
    parser.add_argument("--task", choices=["sft", "dpo"], default="sft", help="trl-padfree train (sft) or dpo")
    for flag in _FAULTS:
        parser.add_argument(flag, type=int, metavar="K")
    parser.add_argument("--full-disk-at-step", type=int, metavar="K")
    parser.add_argument("--ballast", help="with --full-disk-at-step: fill the filesystem of this file "
                        "('beside-output-dir': of a file next to this rank's output_dir)")
    parser.add_argument("--fsize-limit", type=int, default=1024, help="with --full-disk-at-step, without --ballast: "
                        "the file-size limit in bytes (default 1024: smaller than a rank's RNG state)")
    options = parser.parse_args(argv[:split] if split >= 0 else [])
    callbacks: list[Any] = []
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if options.rank in (None, rank) and options.attempt == attempt:
        for flag, kind in _FAULTS.items():
            step = getattr(options, flag[2:].replace("-", "_"))
            if step is not None:
                callbacks.append(kind(step))
        if options.full_disk_at_step is not None:
            ballast = options.ballast
            if ballast == "beside-output-dir":  # this rank's own disk: the directory that holds its output_dir
                out = argv[split + 1 :][argv[split + 1 :].index("--output_dir") + 1]
                ballast = os.path.join(os.path.dirname(os.path.abspath(out)), "ballast")
            callbacks.append(FullDiskAtEnd(ballast, options.fsize_limit, at_step=options.full_disk_at_step))
    from trl_padfree.launch import main

    return main(argv[split + 1 :], callbacks=callbacks, task=options.task)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
