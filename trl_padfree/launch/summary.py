"""The end-of-run summary (printed, and saved as ``launch_summary.json``), from the Trainer's metrics and its log
history (which a checkpoint carries: after a resume it covers the whole run)."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["RunResult", "eval_loss_line", "run_train_loss", "summary_lines", "summary_record", "write_summary"]


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
    train_loss: float | None  # mean over the whole run's steps (run_train_loss)
    last_train_loss: float | None
    steps_this_process: int | None = None  # fewer than global_step after a resume
    train_loss_steps: int | None = None
    first_eval_step: int | None = None
    last_eval_step: int | None = None

    @classmethod
    def from_trainer(cls, trainer: Any, metrics: dict[str, Any], **outcome: Any) -> RunResult:
        """The result of ``trainer``'s run from its state and log history; ``outcome``: ``interrupted``,
        ``checkpoint``, ``saved_to``."""
        state, history = trainer.state, trainer.state.log_history
        evals = [e for e in history if "eval_loss" in e]
        first, last = (evals[0], evals[-1]) if evals else ({}, {})
        train_loss, steps = run_train_loss(history)  # the whole run, also after a resume
        return cls(global_step=state.global_step, max_steps=state.max_steps, metrics=metrics, train_loss=train_loss,
                   first_eval_loss=first.get("eval_loss"), last_eval_loss=last.get("eval_loss"),
                   last_train_loss=next((e["loss"] for e in reversed(history) if "loss" in e), None),
                   steps_this_process=state.global_step - (trainer.first_step if trainer.first_step is not None
                                                           else state.global_step),
                   train_loss_steps=steps, first_eval_step=first.get("step"), last_eval_step=last.get("step"),
                   **outcome)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


def run_train_loss(history: list[dict[str, Any]]) -> tuple[float | None, int]:
    """``(mean training loss over the steps the log history covers, how many steps)``: each logged ``loss`` is the
    mean since the previous log, so it weighs by those steps.

    >>> run_train_loss([{"loss": 4.0, "step": 10}, {"eval_loss": 3.0, "step": 10}, {"loss": 1.0, "step": 15}])
    (3.0, 15)
    """
    total = covered = previous = 0
    for entry in history:
        if "loss" in entry and isinstance(entry.get("step"), int) and entry["step"] > previous:
            total += entry["loss"] * (entry["step"] - previous)
            covered += entry["step"] - previous
            previous = entry["step"]
    return (total / covered if covered else None), covered


def summary_lines(result: RunResult, padding_free: bool) -> list[str]:
    """The end-of-run summary (a few lines)."""
    m, ran = result.metrics, result.steps_this_process
    resumed = ran is not None and ran < result.global_step
    stopped = f" (stopped by {result.interrupted})" if result.interrupted else ""
    here = f", {ran} of them in this process (resumed at step {result.global_step - ran})," if resumed else ""
    tokens = m.get("train_real_tokens_per_second")
    lines = [f"steps: {result.global_step}/{result.max_steps}{here} in {m.get('train_runtime', 0.0):.1f} s{stopped}",
             (f"real tokens/s: {tokens:,.0f}" if tokens is not None else "real tokens/s: n/a")
             + (" (this process's steps)" if resumed else "")]
    if m.get("train_padding_share") is not None:
        lines.append(f"{'padding avoided' if padding_free else 'padding spent'}: "
                     f"{100 * m['train_padding_share']:.1f}% of the tokens a padded batch would have had")
    over = f"the run's {result.train_loss_steps} steps" if result.train_loss_steps is not None else "the run"
    lines.append(f"train loss: {_fmt(result.train_loss)} (mean over {over}), last logged "
                 f"{_fmt(result.last_train_loss)}")
    if result.last_eval_loss is not None:
        lines.append(eval_loss_line(result))
    if result.checkpoint:
        lines.append(f"checkpoint saved to {result.checkpoint}; resume with --resume_from_checkpoint "
                     f"{result.checkpoint}")
    if result.saved_to:
        lines.append(f"model saved to {result.saved_to}")
    return lines


def _at(step: int | None) -> str:
    return "" if step is None else " (step 0, before training)" if step == 0 else f" (step {step})"


def eval_loss_line(result: RunResult) -> str:
    """The first and the last evaluation, each with its step.

    >>> eval_loss_line(RunResult(40, 40, None, None, None, {}, 2.5, 0.0763, None, None, None, None, 0, 40))
    'eval loss: 2.5000 (step 0, before training) -> 0.0763 (step 40)'
    """
    first, last = result.first_eval_loss, result.last_eval_loss
    if first is None or (result.first_eval_step == result.last_eval_step if result.last_eval_step is not None
                         else first == last):
        return f"eval loss: {_fmt(last)}{_at(result.last_eval_step)}"
    return f"eval loss: {_fmt(first)}{_at(result.first_eval_step)} -> {_fmt(last)}{_at(result.last_eval_step)}"


def summary_record(result: RunResult, **extra: Any) -> dict[str, Any]:
    """``launch_summary.json``'s content: ``train_loss`` is the whole run's mean; transformers' own (this process's
    steps) is ``train_loss_this_process``, not repeated under ``metrics``.

    >>> r = RunResult(10, 10, None, None, "out", {"train_loss": 2.0, "train_runtime": 1.5}, None, None, 3.0, 1.0)
    >>> record = summary_record(r); record["train_loss"], record["train_loss_this_process"], record["metrics"]
    (3.0, 2.0, {'train_runtime': 1.5})
    """
    record = asdict(result)
    record["metrics"] = dict(record["metrics"])
    record["train_loss_this_process"] = record["metrics"].pop("train_loss", None)
    return {**record, **extra}


def write_summary(result: RunResult, output_dir: str, **extra: Any) -> None:
    """Save ``result`` (and ``extra`` fields) as ``output_dir/launch_summary.json``."""
    from .resume import write_json

    write_json(os.path.join(output_dir, "launch_summary.json"), summary_record(result, **extra))
