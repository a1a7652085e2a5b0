"""The ``trl-padfree train`` run, stage by stage.

1. parse and validate the config (:mod:`.config`, :mod:`.validate`): nothing loaded yet;
2. load the tokenizer (:mod:`.tokenizer`), make the collator (:mod:`.collators`) and prepare the data
   (:mod:`.data`), including the response-template check;
3. load the model (:mod:`.model`) and, for padding-free runs, probe that packed examples stay apart (:mod:`.probe`);
4. train with :class:`~.trainer.PadfreeSFTTrainer` (SIGTERM / Ctrl-C save a checkpoint, see :mod:`.callbacks`;
   checkpoints and the final model appear complete or not at all, see :mod:`.checkpoints`), save the model, then
   run the final evaluation, and print a summary (:mod:`.summary`).

Stages 1-3 raise :class:`~.config.ConfigError` for bad input; ``main`` turns it into one line on stderr and exit
code 2. Nothing is written (no ``output_dir``) before stage 4.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

from ..messages import one_line
from ..threads import torch_threads
from .collators import make_collator_factory
from .config import LaunchConfig
from .console import quiet_progress, say
from .model import load_model
from .probe import probe_model
from .summary import RunResult, eval_losses, run_train_loss, summary_lines, write_summary
from .tokenizer import load_tokenizer

__all__ = ["train"]


def train(cfg: LaunchConfig, callbacks: Sequence[Any] = ()) -> RunResult:
    """Stages 2-4 (see the module docstring) on a validated config; ``callbacks``: extra Trainer callbacks."""
    with torch_threads(cfg.launch.torch_num_threads):
        return _train(cfg, callbacks)


def _train(cfg: LaunchConfig, callbacks: Sequence[Any] = ()) -> RunResult:
    from .distributed import check_process_group

    training = cfg.training
    check_process_group(training)  # before anything is written
    if training.ddp_find_unused_parameters is None:
        # transformers turns it on for every model without activation checkpointing (and every PEFT model): an
        # extra autograd traversal per step and a warning. The models trained here (LoRA included) use every
        # trainable parameter in each forward; a model that does not fails in DDP with torch's error naming the fix
        # (set ddp_find_unused_parameters: true).
        training.ddp_find_unused_parameters = False
    for note in cfg.notes:
        say(note)
    with quiet_progress():
        say(f"preparing data (tokenizer of {cfg.model.model_name_or_path})")
        with training.main_process_first(desc="loading the tokenizer"):
            tokenizer = load_tokenizer(cfg)
        with training.main_process_first(desc="preparing the data"):
            data = _prepare_preferences(cfg, tokenizer) if cfg.task == "dpo" else _prepare_sft_data(cfg, tokenizer)
        say(f"loading model {cfg.model.model_name_or_path} (attn_implementation={cfg.attn_implementation!r}, "
            f"dtype={cfg.model.dtype})")
        model = load_model(cfg)
        check = None
        if cfg.task == "dpo":
            from .dpo import probe_check

            check = probe_check(cfg)
        if cfg.padding_free and cfg.launch.check_packing:
            probe_model(model, training, check=check)
        ref_model = None
        if cfg.task == "dpo":
            from .dpo import load_reference

            ref_model = load_reference(cfg)
            say("reference model: " + ("a second copy of the starting weights" if ref_model is not None else
                                       "the policy with its LoRA adapters switched off"))
        return _fit(cfg, tokenizer, model, data, callbacks, ref_model)  # (the Trainer's own bar follows disable_tqdm)


def _prepare_preferences(cfg: LaunchConfig, tokenizer: Any) -> Any:
    """``trl-padfree dpo``'s data: checked preference records (TRL's DPOTrainer tokenizes them when built)."""
    from .dpo import load_preference_data

    data = load_preference_data(cfg, tokenizer)
    say(f"data: {len(data.train)} training pairs" + (f", {len(data.eval)} eval pairs" if data.eval is not None else "")
        + f" (format: {data.text_format})")
    for split, count in data.dropped.items():
        if count:
            total = len(data.train if split == "train" else data.eval)
            say(f"dropped {count} of {total} {split} pairs whose prompt alone has max_length={cfg.training.max_length} "
                "tokens or more (truncation_mode keep_start leaves them no response token; TRL drops them)")
    return data


def _prepare_sft_data(cfg: LaunchConfig, tokenizer: Any) -> Any:
    """``trl-padfree train``'s data: formatted, tokenized and labelled by the collator, with the template check."""
    from .data import prepare_data

    training = cfg.training
    label_factory = make_collator_factory(cfg, tokenizer, padding_free=True, quiet=True)
    data = prepare_data(cfg, tokenizer, label_factory)
    say(f"data: {len(data.train)} training examples"
        + (f", {len(data.eval)} eval examples" if data.eval is not None else "") + f" (format: {data.text_format})")
    if data.template_missing_in_check:
        say(f"warning: {data.template_missing_in_check} of the first {data.checked} examples have no response "
            f"template {cfg.collator.response_template!r}")
    for split, count in data.dropped.items():
        if count:
            say(f"dropped {count} of {data.loaded[split]} {split} examples with no trained token left (response "
                f"template missing, or the completion cut off by max_length={training.max_length})")
    return data


def _fit(cfg: LaunchConfig, tokenizer: Any, model: Any, data: Any, callbacks: Sequence[Any] = (),
         ref_model: Any = None) -> RunResult:
    from trl import get_peft_config

    from .callbacks import GracefulStop
    from .checkpoints import (
        AtomicCheckpoints,
        RunError,
        begin_run,
        crash_reported,
        end_run,
        save_final_model,
        trainer_settings_checked,
    )
    from .distributed import describe_distribution
    from .trainer import PadfreeSFTTrainer

    training = cfg.training

    class LaunchTrainer(AtomicCheckpoints, PadfreeSFTTrainer):
        """``PadfreeSFTTrainer`` whose checkpoints appear complete or not at all (:mod:`.checkpoints`)."""

    stop = GracefulStop(announce=say)
    # TRL's own checks at construction: exit 2, one line; peft reads transformers' deprecated
    # `is_gradient_checkpointing` when it wraps the model (use_peft: a FutureWarning no setting can avoid)
    with trainer_settings_checked(training.output_dir, "DPOTrainer" if cfg.task == "dpo" else "SFTTrainer"), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        if cfg.task == "dpo":
            from .dpo import make_trainer

            trainer = make_trainer(cfg, tokenizer, model, ref_model, data, [*callbacks, stop])
        else:
            collator = make_collator_factory(cfg, tokenizer, padding_free=cfg.padding_free, quiet=False)()
            trainer = LaunchTrainer(
                model=model,
                args=training,
                data_collator=collator,
                train_dataset=data.train,
                eval_dataset=data.eval,
                processing_class=tokenizer,
                peft_config=get_peft_config(cfg.model),
                callbacks=[*callbacks, stop],  # extra callbacks act first within a step (a test hook signals before the check)
                max_tokens_per_batch=cfg.launch.max_tokens_per_batch,
            )
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
    )
    if trainer.is_world_process_zero():
        # the settings of this trainer only: max_tokens_per_batch for SFT, prompt_once for DPO
        task_settings = ({"prompt_once": bool(getattr(cfg.collator, "prompt_once", False))} if cfg.task == "dpo"
                         else {"max_tokens_per_batch": cfg.launch.max_tokens_per_batch})
        write_summary(result, training.output_dir, padding_free=cfg.padding_free,
                      attn_implementation=cfg.attn_implementation, **describe_distribution(training),
                      **task_settings)
        lines = summary_lines(result, cfg.padding_free)
        if cfg.task == "dpo":
            from .dpo import preference_summary

            lines = preference_summary(lines, trainer.state.log_history)
        for line in lines:
            say(line)
    end_run(trainer, "interrupted" if interrupted else "finished", checkpoint=checkpoint, saved_to=saved_to)
    if eval_error is not None:
        raise RunError(f"the final evaluation failed: {eval_error}; the trained model is saved in {saved_to}")
    # no trainer.end(): it destroys the process group while DDP still holds it, and freeing DDP afterwards runs the
    # gloo group's destructor, which can deadlock; launch.distributed.finish ends the group safely for every rank
    return result
