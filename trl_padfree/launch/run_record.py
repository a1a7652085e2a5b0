"""The steps around training that keep the run's record (:data:`~.resume.RUN_FILE`), say where the work is when
training fails, and save the final model whole or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

from ..exception_text import one_line
from .config import ConfigError
from .resume import RUN_FILE, last_complete_checkpoint, read_json, read_run, write_json

__all__ = ["RunError", "begin_run", "crash_reported", "end_run", "save_final_model", "trainer_settings_checked",
           "write_run"]


class RunError(RuntimeError):
    """A failure during the run itself (not bad input): one line, exit 1."""


def write_run(output_dir: str, **fields: Any) -> None:
    write_json(os.path.join(output_dir, RUN_FILE), {**(read_run(output_dir) or {}), **fields})


@contextlib.contextmanager
def trainer_settings_checked(output_dir: str, trainer: str = "SFTTrainer") -> Iterator[None]:
    """Around building the trainer: a ``ValueError`` (TRL's and transformers' checks of the settings) becomes a
    one-line :class:`ConfigError` (exit 2), and the empty ``output_dir`` the Trainer created is removed."""
    existed = os.path.exists(output_dir)
    try:
        yield
    except ValueError as exc:
        if not existed:
            with contextlib.suppress(OSError):
                os.rmdir(output_dir)
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{trainer} refused the settings: {one_line(exc)}") from None


def begin_run(trainer: Any, run_id: str | None, resume_from: str | None) -> bool:
    """Record the run in ``output_dir``; False when ``resume_from`` is at the run's last step (its weights and state
    are then loaded here: ``trainer.train()`` would train one step past the end)."""
    from transformers import TrainerState

    trainer.run_id = run_id
    if getattr(trainer, "checkpoint_marker", None) is not None:
        trainer.checkpoint_marker.run_id = run_id
    if trainer.args.save_on_each_node:
        # transformers 5.24's save_pretrained writes on global rank 0 only once torch.distributed is up, whatever
        # save_on_each_node says (PreTrainedModel.should_save_on_this_rank): let the Trainer decide (should_save)
        model = trainer.accelerator.unwrap_model(trainer.model)
        model.should_save_on_this_rank = lambda is_main_process: bool(is_main_process)
    if trainer.args.should_save:
        os.makedirs(trainer.args.output_dir, exist_ok=True)
        write_run(trainer.args.output_dir, run_id=run_id, status="training", resumed_from=resume_from)
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
    except Exception:
        last = last_complete_checkpoint(trainer.args.output_dir, trainer.run_id)
        say(f"training stopped by an error at step {trainer.state.global_step}; "
            + (f"the last complete checkpoint of this run is {last} (resume with --resume_from_checkpoint true)"
               if last else "no checkpoint of this run was saved"))
        raise


def save_final_model(trainer: Any, output_dir: str) -> None:
    """``trainer.save_model`` into a staging directory moved into ``output_dir`` once all is written: a failed save
    (a full disk) leaves nothing partial and raises a :class:`RunError` naming the last complete checkpoint."""
    from .distributed import any_process

    staging, main = os.path.join(output_dir, ".trl_padfree_final"), trainer.args.should_save
    error: BaseException | None = None
    try:
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        trainer.save_model(staging)
    except Exception as exc:  # OSError, or the safetensors writer's own error type  # noqa: BLE001
        error = exc
    if any_process(error is not None):
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        last = last_complete_checkpoint(output_dir, getattr(trainer, "run_id", None))
        where = (f"the last complete checkpoint is {last} (resume with --resume_from_checkpoint true once there is "
                 "space)" if last else "no checkpoint of this run was saved (save_strategy), so the trained "
                 "weights are lost")
        reason = one_line(error, limit=200) if error is not None else "it failed on another process"
        raise RunError(f"could not save the final model to {output_dir!r}: {reason}; {where}")
    if main:
        for name in sorted(os.listdir(staging)):
            os.replace(os.path.join(staging, name), os.path.join(output_dir, name))
        os.rmdir(staging)
    trainer.accelerator.wait_for_everyone()


def _share_summary(trainer: Any) -> None:
    """Several nodes: rank 0's summary reaches every node's console and (``save_on_each_node``) output_dir."""
    import torch.distributed as dist

    from .console import say
    from .summary import RunResult, summary_lines

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if int(os.environ.get("LOCAL_WORLD_SIZE", str(world))) >= world or not dist.is_initialized():
        return
    output_dir = trainer.args.output_dir
    box = [read_json(os.path.join(output_dir, "launch_summary.json")) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    summary = box[0]
    if dist.get_rank() == 0 or summary is None:
        return
    if summary.get("saved_to"):
        summary["saved_to"] = output_dir
    if summary.get("checkpoint"):
        summary["checkpoint"] = os.path.join(output_dir, os.path.basename(summary["checkpoint"]))
    if trainer.args.should_save:
        write_json(os.path.join(output_dir, "launch_summary.json"), summary)
        trainer.state.save_to_json(os.path.join(output_dir, "trainer_state.json"))
    fields = RunResult.__dataclass_fields__
    for line in summary_lines(RunResult(**{k: summary.get(k) for k in fields}), bool(summary.get("padding_free"))):
        say(line)


def end_run(trainer: Any, status: str, **fields: Any) -> None:
    """Record how the run ended (``finished``, ``interrupted``; ``failed``: best effort, the disk may be full)."""
    if status != "failed":
        _share_summary(trainer)
    if trainer.args.should_save:
        try:
            write_run(trainer.args.output_dir, status=status, global_step=trainer.state.global_step,
                      max_steps=trainer.state.max_steps, **fields)
        except OSError:
            if status != "failed":
                raise
