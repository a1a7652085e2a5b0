"""The ``trl-padfree train`` run, stage by stage.

1. parse and validate the config (:mod:`.config`, :mod:`.validate`): nothing loaded yet;
2. load the tokenizer and prepare the data (:mod:`.data`), including the response-template check;
3. load the model and, for padding-free runs, probe that packed examples stay apart (:mod:`trl_padfree.probe`);
4. train with :class:`~.trainer.PadfreeSFTTrainer` (SIGTERM / Ctrl-C save a checkpoint, see :mod:`.callbacks`),
   save the model and print a summary.

Stages 1-3 raise :class:`~.config.ConfigError` for bad input; ``main`` turns it into one line on stderr and exit
code 2. Nothing is written (no ``output_dir``) before stage 4.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .config import ConfigError, LaunchConfig

__all__ = ["RunResult", "is_main_process", "load_model", "load_tokenizer", "say", "train"]


def is_main_process() -> bool:
    """True on the process that logs (rank 0), also before the Trainer has set up distribution."""
    return int(os.environ.get("RANK", "0")) == 0


def say(message: str) -> None:
    """Print a launcher message on the main process only."""
    if is_main_process():
        print(f"[trl-padfree] {message}", flush=True)


def quiet_replicas() -> None:
    """Silence library logging, warnings and progress bars on every process but the main one."""
    if is_main_process():
        return
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    warnings.filterwarnings("ignore")


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """No progress bars from datasets / transformers loading (pre-flight stages print one line each instead)."""
    import datasets
    import transformers

    datasets_on = datasets.is_progress_bar_enabled()
    transformers_on = transformers.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        if datasets_on:
            datasets.enable_progress_bars()
        if transformers_on:
            transformers.utils.logging.enable_progress_bar()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def load_tokenizer(cfg: LaunchConfig) -> Any:
    """The tokenizer of ``model_name_or_path`` with the ``eos_token`` / ``pad_token`` / chat template overrides."""
    from transformers import AutoTokenizer

    name = cfg.model.model_name_or_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            name, revision=cfg.model.model_revision, trust_remote_code=cfg.training.trust_remote_code
        )
    except Exception as exc:
        raise ConfigError(f"could not load the tokenizer of {name!r}: {_one_line(exc)}") from None
    training = cfg.training
    for attr in ("eos_token", "pad_token"):
        value = getattr(training, attr)
        if value is not None:
            if value not in tokenizer.get_vocab():
                raise ConfigError(f"{attr}={value!r} is not in the vocabulary of {name!r}")
            setattr(tokenizer, attr, value)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if training.chat_template_path is not None:
        path = training.chat_template_path
        if not (os.path.isfile(path) and path.endswith((".jinja", ".j2"))):
            raise ConfigError(f"chat_template_path={path!r} must be an existing .jinja file")
        with open(path, encoding="utf-8") as handle:
            tokenizer.chat_template = handle.read()
    return tokenizer


def make_collator_factory(cfg: LaunchConfig, tokenizer: Any, padding_free: bool, quiet: bool) -> Any:
    """A picklable zero-argument factory of the project's collator with the run's settings."""
    from trl_padfree.collator import DataCollatorForCompletionOnlyLM

    instruction = cfg.collator.instruction_template
    if instruction is not None and len(instruction) == 1:
        instruction = instruction[0]
    kwargs = {
        "tokenizer": tokenizer,
        "padding_free": padding_free,
        "on_template_not_found": "ignore" if quiet else "warn",
    }
    if not padding_free and isinstance(cfg.training.pad_to_multiple_of, int):
        kwargs["pad_to_multiple_of"] = cfg.training.pad_to_multiple_of
    factory = functools.partial(DataCollatorForCompletionOnlyLM, cfg.collator.response_template, instruction, **kwargs)
    try:
        factory()
    except ValueError as exc:
        raise ConfigError(f"collator settings rejected: {_one_line(exc)}") from None
    return factory


def load_model(cfg: LaunchConfig) -> Any:
    """Load the model with the resolved attention implementation and dtype (the ``padfree`` attention registered)."""
    from transformers import AutoModelForCausalLM
    from trl import get_quantization_config

    import trl_padfree.attention  # noqa: F401  (registers attn_implementation="padfree")

    model_args = cfg.model
    quantization = get_quantization_config(model_args)
    kwargs: dict[str, Any] = {
        "revision": model_args.model_revision,
        "trust_remote_code": cfg.training.trust_remote_code,
        "attn_implementation": cfg.attn_implementation,
        "dtype": model_args.dtype,
    }
    if quantization is not None:
        from accelerate import PartialState

        # k-bit weights are placed at load time, one full copy per process (TRL's own scripts do the same)
        kwargs.update(quantization_config=quantization, device_map={"": PartialState().local_process_index})
    kwargs.update(cfg.training.model_init_kwargs or {})
    try:
        return AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)
    except Exception as exc:
        raise ConfigError(f"could not load model {model_args.model_name_or_path!r}: {_one_line(exc)}") from None


def _materialized(model: Any) -> bool:
    """Whether this process holds the model's real weights (not meta tensors, not DeepSpeed ZeRO-3 shards)."""
    return all(p.device.type != "meta" and not hasattr(p, "ds_id") for p in model.parameters())


def _sharded_launch(training: Any) -> bool:
    env = os.environ
    return (
        env.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        or env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
        or bool(training.deepspeed)
        or bool(training.fsdp)
    )


def _failed_anywhere(failure: str | None) -> str | None:
    """Share a probe failure between processes, so that every rank stops (none waits in a collective)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return failure
    device = torch.device("cpu") if dist.get_backend() == "gloo" else torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([0 if failure is None else 1], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() and failure is None:
        return "padding-free training is unsafe for this model (the packing probe failed on another process)"
    return failure


def probe_model(model: Any, training: Any) -> None:
    """Raise :class:`ConfigError` if packed examples leak under the model's attention implementation.

    Judged at the training precision (bf16/fp16 mixed precision gets that dtype's tolerance), on the training
    device where the Trainer would put the model anyway. A process that holds no real weights (FSDP loading on
    rank 0 only, DeepSpeed ZeRO-3 shards) skips the probe; any process's failure stops every process.
    """
    import torch

    from trl_padfree.probe import DEFAULT_RTOL, PackingLeakError, assert_packing_safe

    failure = None
    if _materialized(model):
        quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
        if training.device.type != "cpu" and not quantized and not _sharded_launch(training):
            model.to(training.device)
        kwargs = {}
        if training.bf16 or training.fp16:
            kwargs["rtol"] = DEFAULT_RTOL[torch.bfloat16 if training.bf16 else torch.float16]
        try:
            report = assert_packing_safe(model, **kwargs)
        except PackingLeakError as exc:
            headline = str(exc.report).splitlines()[0]
            failure = f"padding-free training is unsafe for this model: {headline} {exc.report.advice}"
        else:
            say(f"packing probe: {report.model_type} with {report.attn_implementation!r} keeps packed examples "
                f"apart (max logit diff {report.max_abs_diff:.2g} <= tolerance {report.tolerance:.2g})")
    else:
        say("packing probe skipped: the weights are sharded at load time here (DeepSpeed ZeRO-3 / FSDP); check the "
            "model once with `trl-padfree check --model NAME`")
    failure = _failed_anywhere(failure)
    if failure is not None:
        raise ConfigError(failure)


@dataclass
class RunResult:
    """What a finished (or interrupted) run did."""

    global_step: int
    max_steps: int
    interrupted: str | None
    checkpoint: str | None
    saved_to: str | None
    metrics: dict[str, Any]
    first_eval_loss: float | None
    last_eval_loss: float | None
    train_loss: float | None  # mean over the steps this process ran (Trainer's train_loss)
    last_train_loss: float | None  # the last logged training loss


def _fmt(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def summary_lines(result: RunResult, padding_free: bool) -> list[str]:
    """The end-of-run summary (a few lines)."""
    m = result.metrics
    tokens_s = m.get("train_real_tokens_per_second")
    share = m.get("train_padding_share")
    lines = [
        f"steps: {result.global_step}/{result.max_steps} in {m.get('train_runtime', 0.0):.1f} s"
        + (f" (stopped by {result.interrupted})" if result.interrupted else ""),
        f"real tokens/s: {tokens_s:,.0f}" if tokens_s is not None else "real tokens/s: n/a",
    ]
    if share is not None:
        verb = "padding avoided" if padding_free else "padding spent"
        lines.append(f"{verb}: {100 * share:.1f}% of the tokens a padded batch would have had")
    lines.append(f"train loss: {_fmt(result.train_loss)} (mean over the run), last logged {_fmt(result.last_train_loss)}")
    if result.last_eval_loss is not None:
        lines.append(f"eval loss: {_fmt(result.first_eval_loss)} -> {_fmt(result.last_eval_loss)}"
                     if result.first_eval_loss is not None and result.first_eval_loss != result.last_eval_loss
                     else f"eval loss: {_fmt(result.last_eval_loss)}")
    if result.checkpoint:
        lines.append(f"checkpoint saved to {result.checkpoint}; resume with --resume_from_checkpoint {result.checkpoint}")
    if result.saved_to:
        lines.append(f"model saved to {result.saved_to}")
    return lines


def _eval_losses(history: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    losses = [entry["eval_loss"] for entry in history if "eval_loss" in entry]
    return (losses[0], losses[-1]) if losses else (None, None)


def train(cfg: LaunchConfig) -> RunResult:
    """Stages 2-4 (see the module docstring) on a validated config."""
    quiet_replicas()
    training = cfg.training
    with quiet_progress():
        say(f"preparing data (tokenizer of {cfg.model.model_name_or_path})")
        with training.main_process_first(desc="loading the tokenizer"):
            tokenizer = load_tokenizer(cfg)
        label_factory = make_collator_factory(cfg, tokenizer, padding_free=True, quiet=True)

        from .data import prepare_data

        with training.main_process_first(desc="preparing the data"):
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
        say(f"loading model {cfg.model.model_name_or_path} (attn_implementation={cfg.attn_implementation!r}, "
            f"dtype={cfg.model.dtype})")
        model = load_model(cfg)
        if cfg.padding_free and cfg.collator.check_packing:
            probe_model(model, training)
    return _fit(cfg, tokenizer, model, data)


def _fit(cfg: LaunchConfig, tokenizer: Any, model: Any, data: Any) -> RunResult:
    from trl import get_peft_config

    from .callbacks import GracefulStop
    from .trainer import PadfreeSFTTrainer

    training = cfg.training
    collator = make_collator_factory(cfg, tokenizer, padding_free=cfg.padding_free, quiet=False)()
    stop = GracefulStop(announce=say)
    trainer = PadfreeSFTTrainer(
        model=model,
        args=training,
        data_collator=collator,
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=tokenizer,
        peft_config=get_peft_config(cfg.model),
        callbacks=[stop],
    )
    with stop:
        output = trainer.train(resume_from_checkpoint=cfg.resume_from_checkpoint)
    metrics = dict(output.metrics)
    history = trainer.state.log_history
    checkpoint = saved_to = None
    if stop.stopped_at is not None:
        checkpoint = os.path.join(training.output_dir, f"checkpoint-{trainer.state.global_step}")
    else:
        if data.eval is not None and not any(
            "eval_loss" in e and e.get("step") == trainer.state.global_step for e in history
        ):
            trainer.evaluate()
        trainer.save_model(training.output_dir)
        saved_to = training.output_dir
    trainer.save_state()
    first_eval, last_eval = _eval_losses(trainer.state.log_history)
    result = RunResult(
        global_step=trainer.state.global_step,
        max_steps=trainer.state.max_steps,
        interrupted=stop.requested,
        checkpoint=checkpoint,
        saved_to=saved_to,
        metrics=metrics,
        first_eval_loss=first_eval,
        last_eval_loss=last_eval,
        train_loss=metrics.get("train_loss"),
        last_train_loss=next((e["loss"] for e in reversed(trainer.state.log_history) if "loss" in e), None),
    )
    if trainer.is_world_process_zero():
        with open(os.path.join(training.output_dir, "launch_summary.json"), "w", encoding="utf-8") as handle:
            json.dump({**result.__dict__, "padding_free": cfg.padding_free,
                       "attn_implementation": cfg.attn_implementation}, handle, indent=2, default=str)
        for line in summary_lines(result, cfg.padding_free):
            say(line)
    if hasattr(trainer, "end"):
        trainer.end()
    return result


def print_error(message: str) -> None:
    """The one-line error of bad input."""
    print(f"trl-padfree train: error: {message}", file=sys.stderr, flush=True)
