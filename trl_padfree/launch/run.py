"""The launch's run for every trainer (what is a trainer's own comes from its task, :mod:`.tasks`): tokenizer and
data, model, packing probe and reference model, then train, save the model, evaluate and print the summary.
Bad input raises :class:`~.config.ConfigError` (exit 2) before anything is written; a failure of the run itself a
:class:`RunError` (exit 1). The run's record is :data:`~.resume.RUN_FILE`."""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from collections.abc import Sequence
from typing import Any

from ..exception_text import one_line
from ..threads import torch_threads
from .callbacks import CheckpointMarker, GracefulStop, NothingToTrain
from .config import ConfigError, LaunchConfig
from .console import is_main_process, quiet_progress, say
from .distributed import any_process, check_process_group, describe_distribution
from .model import load_model, materialized, sharded_launch
from .resume import last_complete_checkpoint, write_json, write_run
from .summary import run_summary, summary_lines
from .tasks import Task, get_task
from .tokenizer import load_tokenizer

__all__ = ["RunError", "make_launch_trainer", "train"]


class RunError(RuntimeError):
    """A failure during the run itself (not bad input): one line, exit 1."""


def train(cfg: LaunchConfig, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """The run of a validated config (returns its summary); ``callbacks``: extra Trainer callbacks."""
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


def probe_model(model: Any, training: Any, check: Any = None) -> None:
    """Raise :class:`ConfigError` on every process if packed examples leak on any, judged at the training precision
    on the training device; a process without real weights (FSDP, ZeRO-3) skips it. ``check``: the task's probe
    (default SFT's)."""
    from trl_padfree.probe import PackingLeakError, assert_packing_safe, training_rtol

    failure = None
    if materialized(model):
        quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
        if training.device.type != "cpu" and not quantized and not sharded_launch(training):
            model.to(training.device)
        try:
            report = (check or assert_packing_safe)(model, rtol=training_rtol(training))
        except PackingLeakError as exc:
            headline = str(exc.report).splitlines()[0]
            failure = f"padding-free training is unsafe for this model: {headline} {exc.report.advice}"
        else:
            from trl_padfree.trainer import probe_passed_line

            if is_main_process():
                print(probe_passed_line(report), flush=True)
    else:
        say("packing probe skipped: the weights are sharded at load time here (DeepSpeed ZeRO-3 / FSDP); check the "
            "model once with `trl-padfree check --model NAME`")
    if any_process(failure is not None):  # every rank stops (none waits in a collective)
        raise ConfigError(failure or "padding-free training is unsafe for this model (the packing probe failed on "
                          "another process)")


def make_launch_trainer(trainer_class: type, cfg: LaunchConfig, tokenizer: Any, model: Any, data: Any,
                        callbacks: Sequence[Any], **own: Any) -> Any:
    """The task's ``trainer_class`` built from the run; no packing check or thread policy of its own (the launch
    did both). ``own``: the trainer's own arguments."""
    from trl import get_peft_config

    from .config import with_fields

    args = with_fields(cfg.training, check_packing=False, torch_num_threads=None)
    return trainer_class(model=model, args=args, train_dataset=data.train, eval_dataset=data.eval,
                         processing_class=tokenizer, peft_config=get_peft_config(cfg.model), callbacks=list(callbacks),
                         **own)


def _fit(cfg: LaunchConfig, task: Task, tokenizer: Any, model: Any, data: Any, callbacks: Sequence[Any] = (),
         ref_model: Any = None) -> dict[str, Any]:
    training, output_dir, run_id = cfg.training, cfg.training.output_dir, cfg.run_id
    stop, marker = GracefulStop(announce=say), CheckpointMarker(run_id)
    existed = os.path.exists(output_dir)
    try:  # TRL's and transformers' own checks at construction: exit 2, one line, no empty output_dir left
        with warnings.catch_warnings():  # peft reads transformers' deprecated `is_gradient_checkpointing` when it
            # wraps the model (use_peft: a FutureWarning no setting can avoid)
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            # extra callbacks act first within a step (a test hook signals before the stop), the marker last (it
            # logs the loss at the stop's checkpoint)
            trainer = task.make_trainer(cfg, tokenizer, model, ref_model, data, [*callbacks, stop, marker])
            task.check_trainer(cfg, trainer, data)  # e.g. the records TRL dropped (before anything is written)
    except ValueError as exc:
        if not existed:
            with contextlib.suppress(OSError):
                os.rmdir(output_dir)
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{task.trainer_name} refused the settings: {one_line(exc)}") from None
    if trainer.args.save_on_each_node:
        # transformers 5.24's save_pretrained writes on global rank 0 only once torch.distributed is up, whatever
        # save_on_each_node says (PreTrainedModel.should_save_on_this_rank): let the Trainer decide (should_save)
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        unwrapped.should_save_on_this_rank = lambda is_main_process: bool(is_main_process)
    if trainer.args.should_save:
        os.makedirs(output_dir, exist_ok=True)
        write_run(output_dir, run_id=run_id, status="training", resumed_from=cfg.resume_from_checkpoint)
    metrics: dict[str, Any] = {}
    try:
        with stop:
            metrics = dict(trainer.train(resume_from_checkpoint=cfg.resume_from_checkpoint).metrics)
    except NothingToTrain:
        say(f"{cfg.resume_from_checkpoint} is at the last step ({trainer.state.global_step}): nothing left to "
            "train; saving its model as the final model")
    except Exception:
        last = last_complete_checkpoint(output_dir, run_id)
        say(f"training stopped by an error at step {trainer.state.global_step}; "
            + (f"the last complete checkpoint of this run is {last} (resume with --resume_from_checkpoint true)"
               if last else "no checkpoint of this run was saved"))
        raise
    state = trainer.state
    checkpoint = saved_to = eval_error = None
    interrupted = stop.stopped_at is not None and state.global_step < state.max_steps
    if interrupted:
        checkpoint = os.path.join(output_dir, f"checkpoint-{state.global_step}")
    else:
        try:  # saved before the final evaluation: a failing evaluation cannot lose the trained weights
            _save_final_model(trainer, output_dir, run_id)
        except RunError:
            _end_run(trainer, "failed")
            raise
        saved_to = output_dir
        if data.eval is not None and not any(
            "eval_loss" in e and e.get("step") == state.global_step for e in state.log_history
        ):
            try:
                trainer.evaluate()
            except Exception as exc:
                eval_error = one_line(exc)
    summary = run_summary(trainer.state, metrics, marker.first_step, checkpoint=checkpoint, saved_to=saved_to,
                          interrupted=stop.requested if interrupted else None)
    if trainer.args.should_save:  # (with save_on_each_node the first process of every node, on its own disk)
        trainer.state.save_to_json(os.path.join(output_dir, "trainer_state.json"))
        write_json(os.path.join(output_dir, "launch_summary.json"), {
            **summary, "padding_free": cfg.padding_free, "attn_implementation": cfg.attn_implementation,
            **describe_distribution(training), **task.summary_settings(cfg), **task.trainer_kwargs(cfg)})
    for line in task.summary_lines(summary_lines(summary, cfg.padding_free), trainer.state.log_history):
        say(line)  # (the first process of every node)
    _end_run(trainer, "interrupted" if interrupted else "finished", checkpoint=checkpoint, saved_to=saved_to)
    if eval_error is not None:
        raise RunError(f"the final evaluation failed: {eval_error}; the trained model is saved in {saved_to}")
    # no trainer.end(): it destroys the process group while DDP still holds it, and freeing DDP afterwards runs the
    # gloo group's destructor, which can deadlock; launch.distributed.finish ends the group safely for every rank
    return summary


def _save_final_model(trainer: Any, output_dir: str, run_id: str | None) -> None:
    """``trainer.save_model`` into a staging directory moved into ``output_dir`` once all is written: a failed save
    (a full disk) leaves nothing partial and raises a :class:`RunError` naming the last complete checkpoint."""
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
        last = last_complete_checkpoint(output_dir, run_id)
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


def _end_run(trainer: Any, status: str, **fields: Any) -> None:
    """Record how the run ended (``finished``, ``interrupted``; ``failed``: best effort, the disk may be full)."""
    if trainer.args.should_save:
        try:
            write_run(trainer.args.output_dir, status=status, global_step=trainer.state.global_step,
                      max_steps=trainer.state.max_steps, **fields)
        except OSError:
            if status != "failed":
                raise
