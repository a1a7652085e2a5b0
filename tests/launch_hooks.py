"""Test-only faults for launch runs: trainer callbacks for ``main(argv, callbacks=[...])``, and a command line for
runs in a subprocess, alone or as each rank of torchrun::

    python tests/launch_hooks.py [--rank R] FAULT... -- TRAIN ARGUMENTS

A fault strikes at optimizer step K of the process whose ``RANK`` is R (default: every process), in torchrun's first
attempt only (a restarted worker runs clean)."""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
from typing import Any

from transformers import TrainerCallback


def _kill_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class AtStep(TrainerCallback):
    """``strike(control)`` at the end of step K."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            self.strike(control)


class SigtermAtStep(AtStep):
    """SIGTERM: the launch saves a checkpoint and stops."""

    def strike(self, control: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


class SigkillAtStep(AtStep):
    def strike(self, control: Any) -> None:
        _kill_now()


class SigkillInSave(AtStep):
    """SIGKILL at the first ``torch.save`` of step K's checkpoint (after the model weights, before the rest)."""

    def strike(self, control: Any) -> None:
        if control.should_save:
            import torch

            torch.save = lambda *a, **k: _kill_now()


class FailInStep(AtStep):
    """Step K raises before its forward pass (the other ranks then wait in its gradient all-reduce)."""

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step + 1 == self.step:
            raise RuntimeError(f"injected failure on rank {os.environ.get('RANK', '0')} at step {self.step}")


class FailAtStep(AtStep):
    """Training raises at the end of step K (after that step's checkpoint, if any, was saved)."""

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_step_end(args, state, control)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not control.should_save:  # (else at the save)
            super().on_step_end(args, state, control)

    def strike(self, control: Any) -> None:
        raise RuntimeError(f"training failed on purpose at step {self.step} (tests/launch_hooks.py)")


class FailEvaluation(TrainerCallback):
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        raise RuntimeError("evaluation failed on purpose (tests/launch_hooks.py)")


class FullDiskAtEnd(TrainerCallback):
    """At the end of training (or of step ``at_step``): fill the filesystem of ``ballast`` (real ENOSPC), or with
    ``ballast=None`` lower RLIMIT_FSIZE to ``fsize_limit`` (real EFBIG); ``restore()`` undoes the limit."""

    def __init__(self, ballast: str | None, fsize_limit: int = 64 * 1024, at_step: int | None = None) -> None:
        self.ballast, self.fsize_limit, self.at_step = ballast, fsize_limit, at_step
        self.previous: tuple[Any, Any] | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.at_step:
            self.fill()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.at_step is None:
            self.fill()

    def fill(self) -> None:
        if self.ballast is None:
            self.previous = (resource.getrlimit(resource.RLIMIT_FSIZE),
                             signal.signal(signal.SIGXFSZ, signal.SIG_IGN))  # EFBIG instead of a kill
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.fsize_limit, self.previous[0][1]))
            return
        with open(self.ballast, "wb") as handle:
            try:
                while True:
                    handle.write(b"\0" * (1 << 20))
                    handle.flush()
            except OSError:
                pass

    def restore(self) -> None:
        if self.previous is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, self.previous[0])
            signal.signal(signal.SIGXFSZ, self.previous[1])
            self.previous = None


_FAULTS = {"--sigterm-at-step": SigtermAtStep, "--sigkill-at-step": SigkillAtStep,
           "--sigkill-in-save-at-step": SigkillInSave, "--fail-in-step": FailInStep}


def _main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else -1  # torchrun drops a "--" that follows the script at once
    parser = argparse.ArgumentParser(prog="tests/launch_hooks.py")
    parser.add_argument("--rank", type=int, help="only this rank (RANK); default every rank")
    for flag in _FAULTS:
        parser.add_argument(flag, type=int, metavar="K")
    options = vars(parser.parse_args(argv[:split] if split >= 0 else []))
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    here = options["rank"] in (None, int(os.environ.get("RANK", "0"))) and first_attempt
    callbacks = [kind(step) for flag, kind in _FAULTS.items()
                 if here and (step := options[flag[2:].replace("-", "_")]) is not None]
    from trl_padfree.launch import main

    return main(argv[split + 1 :], callbacks=callbacks)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
