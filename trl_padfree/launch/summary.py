"""The end-of-run summary of ``trl-padfree train`` (printed, and saved as ``launch_summary.json``)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["RunResult", "eval_loss_line", "eval_loss_steps", "eval_losses", "run_train_loss", "summary_lines", "summary_record", "write_summary"]


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
    train_loss: float | None  # mean over the whole run's steps, from the log history (run_train_loss)
    last_train_loss: float | None  # the last logged training loss
    steps_this_process: int | None = None  # optimizer steps this process ran (fewer than global_step after a resume)
    train_loss_steps: int | None = None  # the steps train_loss covers (all steps: the launch logs every last step)
    first_eval_step: int | None = None  # the global step of the evaluation first_eval_loss comes from
    last_eval_step: int | None = None  # the global step of the evaluation last_eval_loss comes from


def _fmt(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def run_train_loss(history: list[dict[str, Any]]) -> tuple[float | None, int]:
    """``(mean training loss over the steps the log history covers, how many steps that is)``.

    Each logged ``loss`` is the mean over the steps since the previous log, so the run's mean weighs it by those
    steps. The history of a resumed run holds the logs of every process that trained it (the checkpoint carries
    them), so this is the whole run's figure; when the last step is logged it equals the ``train_loss``
    transformers reports for an uninterrupted run.

    >>> run_train_loss([{"loss": 4.0, "step": 10}, {"eval_loss": 3.0, "step": 10}, {"loss": 1.0, "step": 15}])
    (3.0, 15)
    >>> run_train_loss([{"train_runtime": 1.0, "step": 0}])
    (None, 0)
    """
    total = covered = previous = 0
    for entry in history:
        if "loss" not in entry or not isinstance(entry.get("step"), int):
            continue
        steps = entry["step"] - previous
        if steps > 0:
            total += entry["loss"] * steps
            covered += steps
            previous = entry["step"]
    return (total / covered if covered else None), covered


def summary_lines(result: RunResult, padding_free: bool) -> list[str]:
    """The end-of-run summary (a few lines)."""
    m = result.metrics
    tokens_s = m.get("train_real_tokens_per_second")
    share = m.get("train_padding_share")
    ran = result.steps_this_process
    resumed = ran is not None and ran < result.global_step
    stopped = f" (stopped by {result.interrupted})" if result.interrupted else ""
    if resumed:  # the figures of this process, the run's steps and loss
        steps = (f"steps: {result.global_step}/{result.max_steps}, {ran} of them in this process (resumed at step "
                 f"{result.global_step - ran}), in {m.get('train_runtime', 0.0):.1f} s{stopped}")
    else:
        steps = f"steps: {result.global_step}/{result.max_steps} in {m.get('train_runtime', 0.0):.1f} s{stopped}"
    lines = [
        steps,
        (f"real tokens/s: {tokens_s:,.0f}" if tokens_s is not None else "real tokens/s: n/a")
        + (" (this process's steps)" if resumed else ""),
    ]
    if share is not None:
        verb = "padding avoided" if padding_free else "padding spent"
        lines.append(f"{verb}: {100 * share:.1f}% of the tokens a padded batch would have had")
    over = (f"mean over the run's {result.train_loss_steps} steps" if result.train_loss_steps is not None
            else "mean over the run")
    lines.append(f"train loss: {_fmt(result.train_loss)} ({over}), last logged {_fmt(result.last_train_loss)}")
    if result.last_eval_loss is not None:
        lines.append(eval_loss_line(result))
    if result.checkpoint:
        lines.append(f"checkpoint saved to {result.checkpoint}; resume with --resume_from_checkpoint {result.checkpoint}")
    if result.saved_to:
        lines.append(f"model saved to {result.saved_to}")
    return lines


def _at_step(step: int | None) -> str:
    if step is None:
        return ""
    return " (step 0, before training)" if step == 0 else f" (step {step})"


def eval_loss_line(result: RunResult) -> str:
    """The summary's eval-loss line: the first and the last evaluation, each with the step it was run at (the first
    one is not "before training" unless it ran at step 0, e.g. with ``eval_on_start``).

    >>> r = RunResult(40, 40, None, None, None, {}, 0.1247, 0.0763, None, None, first_eval_step=20, last_eval_step=40)
    >>> eval_loss_line(r)
    'eval loss: 0.1247 (step 20) -> 0.0763 (step 40)'
    >>> eval_loss_line(RunResult(40, 40, None, None, None, {}, 2.5, 0.0763, None, None, first_eval_step=0,
    ...                          last_eval_step=40))
    'eval loss: 2.5000 (step 0, before training) -> 0.0763 (step 40)'
    >>> eval_loss_line(RunResult(40, 40, None, None, None, {}, 0.0763, 0.0763, None, None, first_eval_step=40,
    ...                          last_eval_step=40))
    'eval loss: 0.0763 (step 40)'
    """
    first, last = result.first_eval_loss, result.last_eval_loss
    one = first is None or (result.first_eval_step == result.last_eval_step if result.last_eval_step is not None
                            else first == last)
    if one:
        return f"eval loss: {_fmt(last)}{_at_step(result.last_eval_step)}"
    return (f"eval loss: {_fmt(first)}{_at_step(result.first_eval_step)} -> {_fmt(last)}"
            f"{_at_step(result.last_eval_step)}")


def eval_losses(history: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """``(first, last)`` eval loss of the log history (:func:`eval_loss_steps`: the steps they were run at)."""
    losses = [entry["eval_loss"] for entry in history if "eval_loss" in entry]
    return (losses[0], losses[-1]) if losses else (None, None)


def eval_loss_steps(history: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    """``(step of the first, step of the last)`` evaluation with an eval loss in the log history.

    >>> eval_loss_steps([{"eval_loss": 1.0, "step": 20}, {"loss": 0.5, "step": 30}, {"eval_loss": 0.4, "step": 40}])
    (20, 40)
    """
    steps = [entry.get("step") for entry in history if "eval_loss" in entry]
    return (steps[0], steps[-1]) if steps else (None, None)


def summary_record(result: RunResult, **extra: Any) -> dict[str, Any]:
    """``launch_summary.json``'s content: one meaning per key.

    ``train_loss`` is the whole run's mean (:func:`run_train_loss`); transformers' own ``train_loss`` (the mean over
    the steps this process ran, fewer than the run's after a resume) is ``train_loss_this_process``, next to
    ``steps_this_process``, and not repeated under ``metrics``.

    >>> r = RunResult(10, 10, None, None, "out", {"train_loss": 2.0, "train_runtime": 1.5}, None, None, 3.0, 1.0, 4, 10)
    >>> record = summary_record(r)
    >>> record["train_loss"], record["train_loss_this_process"], record["metrics"]
    (3.0, 2.0, {'train_runtime': 1.5})
    """
    record = asdict(result)
    metrics = dict(record["metrics"])
    record["train_loss_this_process"] = metrics.pop("train_loss", None)
    record["metrics"] = metrics
    return {**record, **extra}


def write_summary(result: RunResult, output_dir: str, **extra: Any) -> None:
    """Save ``result`` (and ``extra`` fields) as ``output_dir/launch_summary.json`` (:func:`summary_record`)."""
    with open(os.path.join(output_dir, "launch_summary.json"), "w", encoding="utf-8") as handle:
        json.dump(summary_record(result, **extra), handle, indent=2, default=str)
