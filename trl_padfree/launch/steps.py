"""The steps the recipes of :mod:`.tasks` share, in order: :func:`load_data`, :func:`load_policy`,
:func:`probe_model`, :func:`load_reference`, :func:`make_trainer`, :func:`fit`. Bad input raises
:class:`~.config.ConfigError` (exit 2) before anything is written, a failure of the run a :class:`RunError` (exit 1)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._compat import quiet_gradient_checkpointing_warning
from ..exception_text import one_line
from .callbacks import CheckpointMarker, GracefulStop, NothingToTrain
from .config import ConfigError, LaunchConfig
from .console import is_main_process, say
from .distributed import describe_distribution, gather
from .model import load_model, load_tokenizer, materialized, sharded_launch
from .resume import last_complete_checkpoint, write_json, write_run
from .summary import run_summary, summary_lines


class RunError(RuntimeError):
    """A failure during the run itself (not bad input): one line, exit 1."""


@dataclass
class Records:
    """A recipe's prepared data: the splits as the trainer takes them, and what the checks found."""

    train: Any
    eval: Any | None
    text_format: str
    dropped: dict[str, int] = field(default_factory=dict)  # records TRL's trainer dropped, per split
    paired: bool = False  # KTO: preference pairs, which TRL unpairs


def eval_summary(title: str, main: dict[str, str], extra: dict[str, str], unit: str = "evaluation"
                 ) -> Callable[..., list[str]]:
    """A recipe's summary lines for :func:`fit`: the shared ones plus ``"<title>: <main> (<extra>; N <unit>s)"``,
    each logged key named by its value, first -> last log entry with a ``main`` key (left out where TRL logged none).

    >>> kto = eval_summary("eval rewards", {"eval_rewards/chosen": "desirable "}, {"eval_kl": "KL "})
    >>> kto(["steps: 2/2"], [{"eval_rewards/chosen": 0.0, "eval_kl": 0.0}, {"eval_rewards/chosen": 0.5, "eval_kl": 0.1}])
    ['steps: 2/2', 'eval rewards: desirable 0.000 -> 0.500 (KL 0.000 -> 0.100; 2 evaluations)']
    >>> eval_summary("eval accuracy", {"eval_accuracy": ""}, {})([], [{"eval_accuracy": 0.5}])
    ['eval accuracy: 0.500 (1 evaluation)']
    """
    def lines(shared: list[str], history: list[dict[str, Any]]) -> list[str]:
        evals = [e for e in history if any(key in e for key in main)]
        if not evals:
            return list(shared)
        first, last = evals[0], evals[-1]
        shown = [[f"{name}{first[k]:.3f}" + (f" -> {last[k]:.3f}" if len(evals) > 1 else "")
                  for k, name in keys.items() if k in first and k in last] for keys in (main, extra)]
        inside = "; ".join(filter(None, [", ".join(shown[1]), f"{len(evals)} {unit}{'s' * (len(evals) > 1)}"]))
        return [*shared, f"{title}: {', '.join(shown[0])} ({inside})"]

    return lines


def prompt_once_settings(cfg: LaunchConfig) -> dict[str, Any]:
    """A recipe's fields of the run line and the summary unless it has ``settings``: ``prompt_once``, if it has one."""
    return {"prompt_once": bool(cfg.training.prompt_once)} if hasattr(cfg.training, "prompt_once") else {}


def load_data(cfg: LaunchConfig, loader: Callable[[LaunchConfig, Any], Any], unit: str | None = None) -> tuple[Any, Any]:
    """``(tokenizer, loader(cfg, tokenizer))``, prepared by the first process of each node before the others; with
    ``unit``, the run's ``data: N training <unit>, M eval <unit> (format: ...)`` line."""
    say(f"preparing data (tokenizer of {cfg.model.model_name_or_path})")
    with cfg.training.main_process_first(desc="loading the tokenizer"):
        tokenizer = load_tokenizer(cfg)
    with cfg.training.main_process_first(desc="preparing the data"):
        data = loader(cfg, tokenizer)
    if unit:
        say_data(data, unit)
    return tokenizer, data


def say_data(data: Any, unit: str, extra: str = "", eval_unit: str | None = None) -> None:
    say(f"data: {len(data.train)} training {unit}" + (f", {len(data.eval)} eval {eval_unit or unit}"
                                                      if data.eval is not None else "")
        + f" (format: {data.text_format}{extra})")


def load_policy(cfg: LaunchConfig, layout: str | None = "sft", auto_class: Any = None) -> tuple[Any, LaunchConfig]:
    """``(the model to train, cfg with the attention it was loaded with)``, probed in ``layout`` (None: not yet)."""
    say(f"loading model {cfg.model.model_name_or_path} (attn_implementation={cfg.attn_implementation!r}, "
        f"dtype={cfg.model.dtype})")
    model, cfg = load_model(cfg, auto_class)
    if layout is not None:
        probe_model(cfg, model, layout)
    return model, cfg


def probe_model(cfg: LaunchConfig, model: Any, layout: str = "sft") -> None:
    """With ``padding_free`` and ``check_packing``: a :class:`ConfigError` on every process if packed examples leak
    on any, at the training precision on the training device (``layout``: ``"sft"`` or one of
    :func:`trl_padfree.probe.assert_layout_packing_safe`). A process without real weights (FSDP, ZeRO-3) skips it."""
    from trl_padfree import probe

    training, failure = cfg.training, None
    if not (cfg.padding_free and training.check_packing):
        return
    if materialized(model):
        quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
        if training.device.type != "cpu" and not quantized and not sharded_launch(training):
            model.to(training.device)
        rtol = probe.training_rtol(training)
        try:
            report = (probe.assert_packing_safe(model, rtol=rtol) if layout == "sft" else probe.assert_layout_packing_safe(
                model, layout=layout, prompt_once=bool(training.prompt_once), rtol=rtol))
        except probe.PackingLeakError as exc:
            headline = str(exc.report).splitlines()[0]
            failure = f"padding-free training is unsafe for this model: {headline} {exc.report.advice}"
        else:
            from trl_padfree.trainer import probe_passed_line

            if is_main_process():
                print(probe_passed_line(report), flush=True)
    else:
        say("packing probe skipped: the weights are sharded at load time here (DeepSpeed ZeRO-3 / FSDP); check the "
            "model once with `trl-padfree check --model NAME`")
    if any(gather(failure is not None)):  # every rank stops (none waits in a collective)
        raise ConfigError(failure or "padding-free training is unsafe for this model (the packing probe failed on "
                          "another process)")


def load_reference(cfg: LaunchConfig) -> Any:
    """DPO's and KTO's reference model: None with ``use_peft`` (TRL switches the adapters off), else a copy."""
    if cfg.model.use_peft:
        say("reference model: the policy with its LoRA adapters switched off")
        return None
    say("reference model: a second copy of the starting weights")
    return load_model(cfg)[0]


def make_trainer(cfg: LaunchConfig, trainer_class: type, tokenizer: Any, model: Any, data: Any,
                 callbacks: Sequence[Any], check: Callable[[Any], None] | None = None, **own: Any) -> Any:
    """``trainer_class`` built from the run (``own``: its own arguments), then ``check(trainer)``; TRL's and
    transformers' refusals are a :class:`ConfigError` and leave no empty output_dir. The launch probed already and
    set the threads: the trainer does neither."""
    from trl import get_peft_config

    cfg.training.check_packing, cfg.training.torch_num_threads = False, None
    existed = os.path.exists(cfg.training.output_dir)
    # extra callbacks act first within a step (a test hook signals before the stop), the marker last (it logs the
    # loss at the stop's checkpoint)
    callbacks = [*callbacks, GracefulStop(announce=say), CheckpointMarker(cfg.run_id)]
    try:
        with quiet_gradient_checkpointing_warning():  # (peft's wrapping, with use_peft)
            trainer = trainer_class(model=model, args=cfg.training, train_dataset=data.train, eval_dataset=data.eval,
                                    processing_class=tokenizer, peft_config=get_peft_config(cfg.model),
                                    callbacks=callbacks, **own)
        if check is not None:
            check(trainer)
    except ValueError as exc:
        if not existed:
            with contextlib.suppress(OSError):
                os.rmdir(cfg.training.output_dir)
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{trainer_class.__name__} refused the settings: {one_line(exc)}") from None
    return trainer


def fit(cfg: LaunchConfig, trainer: Any, data: Any, settings: dict[str, Any],
        lines: Callable[[list[str], list[dict[str, Any]]], list[str]] | None = None) -> dict[str, Any]:
    """Train (SIGTERM / Ctrl-C: stop with a checkpoint), save the model, evaluate where the last step did not, and
    write and print the summary (``settings``: the recipe's fields of it; ``lines``: an :func:`eval_summary`)."""
    training, output_dir, run_id = trainer.args, cfg.training.output_dir, cfg.run_id
    stop, marker = (next(c for c in trainer.callback_handler.callbacks if isinstance(c, kind))
                    for kind in (GracefulStop, CheckpointMarker))
    if training.save_on_each_node:
        # transformers 5.24's save_pretrained writes on global rank 0 only once torch.distributed is up, whatever
        # save_on_each_node says (PreTrainedModel.should_save_on_this_rank): let the Trainer decide (should_save)
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        unwrapped.should_save_on_this_rank = lambda is_main_process: bool(is_main_process)
    if training.should_save:
        os.makedirs(output_dir, exist_ok=True)
        write_run(output_dir, run_id=run_id, status="training", resumed_from=cfg.training.resume_from_checkpoint)
    metrics: dict[str, Any] = {}
    try:
        with stop:
            metrics = dict(trainer.train(resume_from_checkpoint=cfg.training.resume_from_checkpoint).metrics)
    except NothingToTrain:
        say(f"{cfg.training.resume_from_checkpoint} is at the last step ({trainer.state.global_step}): nothing left to "
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
        _save_final_model(trainer, output_dir, run_id)  # before the final evaluation, which cannot lose the weights
        saved_to = output_dir
        evaluated = any("eval_loss" in e and e.get("step") == state.global_step for e in state.log_history)
        if data.eval is not None and not evaluated:
            try:
                trainer.evaluate()
            except Exception as exc:
                eval_error = one_line(exc)
    summary = run_summary(state, metrics, marker.first_step, checkpoint=checkpoint, saved_to=saved_to,
                          interrupted=stop.requested if interrupted else None)
    if training.should_save:  # (with save_on_each_node the first process of every node, on its own disk)
        state.save_to_json(os.path.join(output_dir, "trainer_state.json"))
        write_json(os.path.join(output_dir, "launch_summary.json"), {
            **summary, "padding_free": cfg.padding_free, "attn_implementation": cfg.attn_implementation,
            **describe_distribution(training), **settings, **scored_head(cfg)})
    shared = summary_lines(summary, cfg.padding_free)
    for line in lines(shared, state.log_history) if lines else shared:
        say(line)  # (the first process of every node)
    _end_run(trainer, "interrupted" if interrupted else "finished", checkpoint=checkpoint, saved_to=saved_to)
    if eval_error is not None:
        raise RunError(f"the final evaluation failed: {eval_error}; the trained model is saved in {saved_to}")
    # no trainer.end(): it destroys the process group while DDP still holds it, and freeing DDP afterwards runs the
    # gloo group's destructor, which can deadlock; launch.distributed.finish ends the group safely for every rank
    return summary


def scored_head(cfg: LaunchConfig) -> dict[str, Any]:
    """``scored_lm_head`` where the trainer has an LM head (its config has the field), for the run line and summary."""
    return {"scored_lm_head": bool(cfg.training.scored_lm_head)} if hasattr(cfg.training, "scored_lm_head") else {}


def _save_final_model(trainer: Any, output_dir: str, run_id: str | None) -> None:
    """``trainer.save_model`` into a staging directory moved into ``output_dir`` once all is written: a failed save
    (a full disk) leaves nothing partial, records the run as failed and raises a :class:`RunError`."""
    staging, main = os.path.join(output_dir, ".trl_padfree_final"), trainer.args.should_save
    error: BaseException | None = None
    try:
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        trainer.save_model(staging)
    except Exception as exc:  # OSError, or the safetensors writer's own error type  # noqa: BLE001
        error = exc
    if any(gather(error is not None)):
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        last = last_complete_checkpoint(output_dir, run_id)
        where = (f"the last complete checkpoint is {last} (resume with --resume_from_checkpoint true once there is "
                 "space)" if last else "no checkpoint of this run was saved (save_strategy), so the trained "
                 "weights are lost")
        reason = one_line(error, limit=200) if error is not None else "it failed on another process"
        _end_run(trainer, "failed")
        raise RunError(f"could not save the final model to {output_dir!r}: {reason}; {where}")
    if main:
        for name in sorted(os.listdir(staging)):
            os.replace(os.path.join(staging, name), os.path.join(output_dir, name))
        os.rmdir(staging)
    trainer.accelerator.wait_for_everyone()


def _end_run(trainer: Any, status: str, **fields: Any) -> None:
    """Record how the run ended (``failed``: best effort, the disk may be full)."""
    if trainer.args.should_save:
        try:
            write_run(trainer.args.output_dir, status=status, global_step=trainer.state.global_step,
                      max_steps=trainer.state.max_steps, **fields)
        except OSError:
            if status != "failed":
                raise
