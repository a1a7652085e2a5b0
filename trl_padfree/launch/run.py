"""The launch's run for every trainer (what is a trainer's own comes from its task, :mod:`.tasks`): tokenizer and
data, model, packing probe and reference model, then train, save the model, evaluate and print the summary.
Bad input raises :class:`~.config.ConfigError` (exit 2) before anything is written."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

from ..exception_text import one_line
from ..threads import torch_threads
from .config import LaunchConfig
from .console import quiet_progress, say
from .model import load_model
from .probe_stage import probe_model
from .summary import RunResult, summary_lines, write_summary
from .tasks import Task, get_task
from .tokenizer import load_tokenizer

__all__ = ["train"]


def train(cfg: LaunchConfig, callbacks: Sequence[Any] = ()) -> RunResult:
    """The run of a validated config; ``callbacks``: extra Trainer callbacks."""
    from .distributed import check_process_group

    training, task = cfg.training, get_task(cfg.task)
    check_process_group(training)  # before anything is written
    for note in cfg.notes:
        say(note)
    threads = training.torch_num_threads
    with torch_threads(None if threads == "auto" else threads), quiet_progress():
        say(f"preparing data (tokenizer of {cfg.model.model_name_or_path})")
        with training.main_process_first(desc="loading the tokenizer"):
            tokenizer = load_tokenizer(cfg)
        with training.main_process_first(desc="preparing the data"):
            data = task.prepare_data(cfg, tokenizer)
        say(f"loading model {cfg.model.model_name_or_path} (attn_implementation={cfg.attn_implementation!r}, "
            f"dtype={cfg.model.dtype})")
        model, cfg = load_model(cfg)  # (cfg: the attention the model was loaded with)
        if cfg.padding_free and cfg.training.check_packing:
            probe_model(model, training, check=task.probe_check(cfg))
        ref_model, line = task.load_reference(cfg)
        if line:
            say(line)
        return _fit(cfg, task, tokenizer, model, data, callbacks, ref_model)  # (the Trainer's own bar follows disable_tqdm)


def _fit(cfg: LaunchConfig, task: Task, tokenizer: Any, model: Any, data: Any, callbacks: Sequence[Any] = (),
         ref_model: Any = None) -> RunResult:
    from .callbacks import GracefulStop
    from .distributed import describe_distribution
    from .run_record import (
        RunError,
        begin_run,
        crash_reported,
        end_run,
        save_final_model,
        trainer_settings_checked,
    )

    training = cfg.training
    stop = GracefulStop(announce=say)
    # TRL's own checks at construction: exit 2, one line; peft reads transformers' deprecated
    # `is_gradient_checkpointing` when it wraps the model (use_peft: a FutureWarning no setting can avoid)
    with trainer_settings_checked(training.output_dir, task.trainer_name), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        # extra callbacks act first within a step (a test hook signals before the check)
        trainer = task.make_trainer(cfg, tokenizer, model, ref_model, data, [*callbacks, stop])
        task.check_trainer(cfg, trainer, data)  # e.g. the records TRL dropped (before anything is written)
    metrics: dict[str, Any] = {}
    if begin_run(trainer, cfg.run_id, cfg.resume_from_checkpoint):
        with stop, crash_reported(trainer, say):
            metrics = dict(trainer.train(resume_from_checkpoint=cfg.resume_from_checkpoint).metrics)
    else:
        say(f"{cfg.resume_from_checkpoint} is at the last step ({trainer.state.global_step}): nothing left to "
            "train; saving its model as the final model")
    history = trainer.state.log_history
    checkpoint = saved_to = eval_error = None
    interrupted = stop.stopped_at is not None and trainer.state.global_step < trainer.state.max_steps
    if interrupted:
        checkpoint = os.path.join(training.output_dir, f"checkpoint-{trainer.state.global_step}")
    else:
        try:  # saved before the final evaluation: a failing evaluation cannot lose the trained weights
            save_final_model(trainer, training.output_dir)
        except RunError:
            end_run(trainer, "failed")
            raise
        saved_to = training.output_dir
        if data.eval is not None and not any(
            "eval_loss" in e and e.get("step") == trainer.state.global_step for e in history
        ):
            try:
                trainer.evaluate()
            except Exception as exc:
                eval_error = one_line(exc)
    trainer.save_state()
    result = RunResult.from_trainer(trainer, metrics, interrupted=stop.requested if interrupted else None,
                                    checkpoint=checkpoint, saved_to=saved_to)
    if trainer.is_world_process_zero():
        write_summary(result, training.output_dir, padding_free=cfg.padding_free,
                      attn_implementation=cfg.attn_implementation, **describe_distribution(training),
                      **task.summary_settings(cfg), **task.trainer_kwargs(cfg))
        lines = task.summary_lines(summary_lines(result, cfg.padding_free), trainer.state.log_history)
        for line in lines:
            say(line)
    end_run(trainer, "interrupted" if interrupted else "finished", checkpoint=checkpoint, saved_to=saved_to)
    if eval_error is not None:
        raise RunError(f"the final evaluation failed: {eval_error}; the trained model is saved in {saved_to}")
    # no trainer.end(): it destroys the process group while DDP still holds it, and freeing DDP afterwards runs the
    # gloo group's destructor, which can deadlock; launch.distributed.finish ends the group safely for every rank
    return result
