"""The launch's run, stage by stage, for every trainer; what is a trainer's own comes from its task
(:mod:`.tasks`, looked up by ``cfg.task``).

1. parse and validate the config (:mod:`.config`, :mod:`.validate`, the task's ``check``): nothing loaded yet;
2. load the tokenizer (:mod:`.tokenizer`) and prepare the data (the task's ``prepare_data``: SFT loads the
   records, :mod:`.data`, and labels them once, :mod:`.tasks.sft_data`, with the response-template check);
3. load the model (:mod:`.model`) and, for padding-free runs, probe that packed sequences stay apart
   (:mod:`.probe_stage`, with the task's ``probe_check``); the task's reference model, if any;
4. train with the task's trainer (``make_trainer``; SIGTERM / Ctrl-C save a checkpoint, see :mod:`.callbacks`;
   checkpoints are marked complete, see :mod:`.callbacks`; the final model appears whole, :mod:`.run_record`), save the model, then
   run the final evaluation, and print a summary (:mod:`.summary`, with the task's ``summary_lines``).

Stages 1-3 raise :class:`~.config.ConfigError` for bad input; ``main`` turns it into one line on stderr and exit
code 2. Nothing is written (no ``output_dir``) before stage 4.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

from ..exception_text import one_line
from ..threads import torch_threads
from .config import ConfigError, LaunchConfig
from .console import quiet_progress, say
from .model import load_model
from .probe_stage import probe_model
from .summary import RunResult, eval_loss_steps, eval_losses, run_train_loss, summary_lines, write_summary
from .tasks import Task, get_task
from .tokenizer import load_tokenizer

__all__ = ["train"]


def train(cfg: LaunchConfig, callbacks: Sequence[Any] = ()) -> RunResult:
    """Stages 2-4 (see the module docstring) on a validated config; ``callbacks``: extra Trainer callbacks."""
    threads = cfg.training.torch_num_threads
    with torch_threads(None if threads == "auto" else threads):
        return _train(cfg, callbacks)


def _train(cfg: LaunchConfig, callbacks: Sequence[Any] = ()) -> RunResult:
    from .distributed import check_process_group

    training = cfg.training
    task = get_task(cfg.task)  # what is the trainer's own, stage by stage (launch.tasks)
    check_process_group(training)  # before anything is written
    for note in cfg.notes:
        say(note)
    with quiet_progress():
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
        existed = os.path.exists(training.output_dir)
        trainer = task.make_trainer(cfg, tokenizer, model, ref_model, data, [*callbacks, stop])
    try:
        task.check_trainer(cfg, trainer, data)  # e.g. the records TRL dropped (before anything is written)
    except ConfigError:
        if not existed and os.path.isdir(training.output_dir) and not os.listdir(training.output_dir):
            os.rmdir(training.output_dir)  # (the Trainer makes it, empty)
        raise
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
    first_eval, last_eval = eval_losses(trainer.state.log_history)
    first_eval_step, last_eval_step = eval_loss_steps(trainer.state.log_history)  # which evaluation each loss is
    run_loss, run_loss_steps = run_train_loss(trainer.state.log_history)  # the whole run, also after a resume
    result = RunResult(
        global_step=trainer.state.global_step,
        max_steps=trainer.state.max_steps,
        interrupted=stop.requested if interrupted else None,
        checkpoint=checkpoint,
        saved_to=saved_to,
        metrics=metrics,
        first_eval_loss=first_eval,
        last_eval_loss=last_eval,
        train_loss=run_loss,
        last_train_loss=next((e["loss"] for e in reversed(trainer.state.log_history) if "loss" in e), None),
        steps_this_process=trainer.state.global_step - (trainer.state.global_step if trainer.first_step is None
                                                         else trainer.first_step),
        train_loss_steps=run_loss_steps,
        first_eval_step=first_eval_step,
        last_eval_step=last_eval_step,
    )
    if trainer.is_world_process_zero():
        # the settings of this trainer only: max_tokens_per_batch for SFT, prompt_once for DPO
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
