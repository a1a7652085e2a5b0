"""Checkpoints and final saves of the launch that are complete or absent, never half-written
(the layout: :mod:`.run_files`).

:class:`AtomicCheckpoints` (a Trainer mixin) writes ``checkpoint-N`` under the staging directory, marks it
complete (:func:`mark_complete`: the run id, the step and every file's size, synced) and renames it into place;
:func:`save_final_model` saves the final model the same way. A save that fails on any process removes what it
wrote and raises a one-line :class:`~.run_record.RunError` naming the last complete checkpoint of the run.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from ..exception_text import one_line
from .collective import any_process, first_failure
from .files import fsync_path, move_into, remove_if_empty, write_json_atomic
from .run_files import CHECKPOINT_MARKER, STAGING_DIR, last_complete_checkpoint
from .run_record import RunError

__all__ = ["AtomicCheckpoints", "mark_complete", "save_final_model"]


def _file_sizes(directory: str) -> dict[str, int]:
    sizes = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory)
            if rel != CHECKPOINT_MARKER:
                sizes[rel] = os.path.getsize(path)
    return sizes


def _sync_files(directory: str) -> dict[str, int]:
    """Flush every file under ``directory`` to disk; their sizes, as :func:`_file_sizes` gives them."""
    sizes = _file_sizes(directory)
    for rel in sizes:
        fsync_path(os.path.join(directory, rel))
    return sizes


def mark_complete(staging: str, run_id: str | None, step: int) -> None:
    """Write the completion marker into ``staging`` and sync every file to disk."""
    sizes = _sync_files(staging)
    write_json_atomic(os.path.join(staging, CHECKPOINT_MARKER), {"run_id": run_id, "step": step, "files": sizes})


class AtomicCheckpoints:
    """Trainer mixin: ``checkpoint-N`` is written under :data:`STAGING_DIR` and renamed into place when complete.

    Put it before the Trainer class (``class T(AtomicCheckpoints, SFTTrainer)``) and set ``run_id`` on the
    instance; every checkpoint's marker carries it.
    """

    run_id: str | None = None
    _staging_root: str | None = None

    def _get_output_dir(self, trial: Any) -> str:
        if self._staging_root is not None:
            return self._staging_root
        return super()._get_output_dir(trial)  # type: ignore[misc]

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        from transformers.trainer_utils import rotate_checkpoints

        run_dir = super()._get_output_dir(trial)  # type: ignore[misc]
        name = f"checkpoint-{self.state.global_step}"  # type: ignore[attr-defined]
        staging_root = os.path.join(run_dir, STAGING_DIR)
        staging = os.path.join(staging_root, name)
        main = self.args.should_save  # type: ignore[attr-defined]
        if main and os.path.exists(staging):
            shutil.rmtree(staging)  # the leftovers of a save that was interrupted
        self.accelerator.wait_for_everyone()  # type: ignore[attr-defined]
        self._staging_root = staging_root
        error: BaseException | None = None
        try:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]
        except Exception as exc:  # OSError, or the safetensors writer's own error type
            error = exc
        finally:
            self._staging_root = None
        failure = first_failure(error)  # also the barrier: every process wrote its files, or one failed
        if failure is not None:
            raise self._save_failed(failure, run_dir, staging) from error
        if not main:
            return
        final = os.path.join(run_dir, name)
        state = self.state  # type: ignore[attr-defined]
        try:
            if state.best_model_checkpoint and os.path.abspath(state.best_model_checkpoint) == os.path.abspath(staging):
                state.best_model_checkpoint = final
                state.save_to_json(os.path.join(staging, "trainer_state.json"))
            mark_complete(staging, self.run_id, state.global_step)
            move_into(staging, final)
        except OSError as exc:
            raise self._save_failed(first_failure(exc, collective=False), run_dir, staging) from exc
        remove_if_empty(staging_root)
        fsync_path(run_dir)
        rotate_checkpoints(
            output_dir=run_dir,
            save_total_limit=self.args.save_total_limit,  # type: ignore[attr-defined]
            best_model_checkpoint=state.best_model_checkpoint,
            use_mtime=True,
        )


    def _save_failed(self, failure: str, run_dir: str, staging: str) -> RunError:
        """Remove the partial checkpoint; the one-line error naming the last complete checkpoint of this run."""
        if self.args.should_save:  # type: ignore[attr-defined]
            shutil.rmtree(staging, ignore_errors=True)
            remove_if_empty(os.path.dirname(staging))
        last = last_complete_checkpoint(run_dir, self.run_id)
        return RunError(
            f"could not write {os.path.basename(staging)}{failure}; "
            + (f"the last complete checkpoint is {last}" if last else "no complete checkpoint of this run exists")
            + " (free space, then resume with --resume_from_checkpoint true)"
        )


def save_final_model(trainer: Any, output_dir: str) -> None:
    """``trainer.save_model(output_dir)``, through a staging directory: the files appear only once all are written.

    Raises :class:`RunError` (one line, naming the last complete checkpoint of the run) if the save fails, after
    removing what it had written.
    """
    staging_root = os.path.join(output_dir, STAGING_DIR)
    staging = os.path.join(staging_root, "final")
    main = trainer.args.should_save
    error: BaseException | None = None
    try:
        if main and os.path.exists(staging):
            shutil.rmtree(staging)
        trainer.save_model(staging)
        if main:
            _sync_files(staging)
    except Exception as exc:  # OSError, or the safetensors writer's own error type
        error = exc
    if any_process(error is not None):
        if main:
            shutil.rmtree(staging, ignore_errors=True)
            remove_if_empty(staging_root)
        last = last_complete_checkpoint(output_dir, getattr(trainer, "run_id", None))
        where = (f"the last complete checkpoint is {last} (resume with --resume_from_checkpoint true once there is "
                 "space)" if last else "no checkpoint of this run was saved (save_strategy), so the trained "
                 "weights are lost")
        reason = one_line(error, limit=200) if error is not None else "it failed on another process"
        raise RunError(f"could not save the final model to {output_dir!r}: {reason}; {where}")
    if main:
        for name in sorted(os.listdir(staging)):
            move_into(os.path.join(staging, name), os.path.join(output_dir, name))
        remove_if_empty(staging)
        remove_if_empty(staging_root)
        fsync_path(output_dir)
    trainer.accelerator.wait_for_everyone()
