"""The run's record in ``output_dir`` (:data:`~.run_files.RUN_FILE`: its id and status) and the steps around
training that keep it: :func:`begin_run` records the run (and clears saves that were interrupted), :func:`end_run`
how it ended (on several nodes, after sharing rank 0's summary), :func:`crash_reported` says where the work is
when training fails, :func:`trainer_settings_checked` turns TRL's refusal of the settings into a one-line
:class:`~.config.ConfigError`. :class:`RunError` is a failure during the run itself (a save on a full disk).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from ..exception_text import one_line
from .config import ConfigError
from .files import read_json, remove_if_empty, write_json_atomic
from .run_files import RUN_FILE, STAGING_DIR, last_complete_checkpoint

__all__ = [
    "RunError",
    "begin_run",
    "crash_reported",
    "end_run",
    "new_run_id",
    "read_run",
    "trainer_settings_checked",
    "write_run",
]


class RunError(RuntimeError):
    """A failure during the run itself (not bad input): ``main`` prints the one-line message and exits with 1."""


def new_run_id() -> str:
    """A fresh run id (32 hex digits).

    >>> len(new_run_id()), new_run_id() != new_run_id()
    (32, True)
    """
    return uuid.uuid4().hex


def read_run(output_dir: str) -> dict[str, Any] | None:
    """The run record of ``output_dir`` (see the module docstring), or None."""
    return read_json(os.path.join(output_dir, RUN_FILE))


def write_run(output_dir: str, **fields: Any) -> None:
    """Update the run record of ``output_dir`` with ``fields`` (atomically)."""
    record = read_run(output_dir) or {}
    record.update(fields)
    write_json_atomic(os.path.join(output_dir, RUN_FILE), record)


@contextlib.contextmanager
def trainer_settings_checked(output_dir: str, trainer: str = "SFTTrainer") -> Iterator[None]:
    """Around building the trainer: a ``ValueError`` (TRL's and transformers' own checks of settings against the
    model and data, e.g. ``router_aux_loss_coef`` for a model that is not a mixture of experts) becomes a
    :class:`ConfigError` (exit 2, one line naming ``trainer``), and the ``output_dir`` the Trainer created for
    nothing is removed.
    """
    existed = os.path.exists(output_dir)
    try:
        yield
    except ValueError as exc:
        if not existed:
            remove_if_empty(output_dir)
        raise ConfigError(f"{trainer} refused the settings: {one_line(exc)}") from None


def begin_run(trainer: Any, run_id: str | None, resume_from: str | None) -> bool:
    """Record the run in ``output_dir`` (main process) and tell whether there is anything left to train.

    Returns False when ``resume_from`` is already at the run's last step (a run whose final save failed after
    its last checkpoint): the checkpoint's weights and state are then loaded here and the caller skips
    ``trainer.train()`` (the Trainer would train one step past the end).
    """
    from transformers import TrainerState

    trainer.run_id = run_id
    output_dir = trainer.args.output_dir
    if trainer.args.save_on_each_node and _several_nodes():
        # transformers 5.24's save_pretrained writes on global rank 0 only once torch.distributed is up
        # (PreTrainedModel.should_save_on_this_rank), whatever save_on_each_node says: every other node's
        # checkpoints and final model would lack their weights and config. The Trainer decides (args.should_save).
        model = trainer.accelerator.unwrap_model(trainer.model)
        model.should_save_on_this_rank = lambda is_main_process: bool(is_main_process)
    if trainer.args.should_save:
        os.makedirs(output_dir, exist_ok=True)
        shutil.rmtree(os.path.join(output_dir, STAGING_DIR), ignore_errors=True)  # saves that were interrupted
        write_run(output_dir, run_id=run_id, status="training", resumed_from=resume_from)
    if resume_from is None:
        return True
    state = read_json(os.path.join(resume_from, "trainer_state.json")) or {}
    max_steps = trainer.set_initial_training_values(trainer.args, trainer.get_train_dataloader())[-1]
    if int(state.get("global_step", 0)) < max_steps:
        return True
    trainer._load_from_checkpoint(resume_from)
    trainer.state = TrainerState.load_from_json(os.path.join(resume_from, "trainer_state.json"))
    return False


@contextlib.contextmanager
def crash_reported(trainer: Any, say: Callable[[str], None]) -> Iterator[None]:
    """Around training: when it stops with an error, say where the work is (the error itself propagates)."""
    try:
        yield
    except RunError:
        raise  # says it already
    except Exception:
        last = last_complete_checkpoint(trainer.args.output_dir, trainer.run_id)
        say(f"training stopped by an error at step {trainer.state.global_step}; "
            + (f"the last complete checkpoint of this run is {last} (resume with --resume_from_checkpoint true)"
               if last else "no checkpoint of this run was saved"))
        raise


def _several_nodes() -> bool:
    """Whether this run's processes span several nodes (torchrun's ``LOCAL_WORLD_SIZE`` < ``WORLD_SIZE``)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("LOCAL_WORLD_SIZE", str(world))) < world


def _share_summary(trainer: Any) -> None:
    """Several nodes: rank 0's summary reaches every node's console, and (each node saving to its own disk) its
    ``launch_summary.json`` and ``trainer_state.json`` too, with this node's paths. Every process calls it."""
    import dataclasses

    import torch.distributed as dist

    from .console import say
    from .summary import RunResult, summary_lines

    if not (_several_nodes() and dist.is_available() and dist.is_initialized()):
        return
    output_dir = trainer.args.output_dir
    box = [read_json(os.path.join(output_dir, "launch_summary.json")) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    summary = box[0]
    if dist.get_rank() == 0 or summary is None:
        return
    for key in ("saved_to", "checkpoint"):
        if summary.get(key):
            summary[key] = output_dir if key == "saved_to" else os.path.join(output_dir, os.path.basename(summary[key]))
    if trainer.args.should_save:
        write_json_atomic(os.path.join(output_dir, "launch_summary.json"), summary)
        trainer.state.save_to_json(os.path.join(output_dir, "trainer_state.json"))
    result = RunResult(**{f.name: summary.get(f.name) for f in dataclasses.fields(RunResult)})
    for line in summary_lines(result, bool(summary.get("padding_free", True))):
        say(line)


def end_run(trainer: Any, status: str, **fields: Any) -> None:
    """Record how the run ended (``finished``, ``interrupted``, ``failed``) in its run file (main process).

    Best effort for ``failed`` (the disk may be full): the failure itself is what gets reported. Other statuses
    are reached by every process together: on several nodes each one then gets rank 0's summary.
    """
    if status != "failed":
        _share_summary(trainer)
    if trainer.args.should_save:
        try:
            write_run(trainer.args.output_dir, status=status, global_step=trainer.state.global_step,
                      max_steps=trainer.state.max_steps, **fields)
        except OSError:
            if status != "failed":
                raise
