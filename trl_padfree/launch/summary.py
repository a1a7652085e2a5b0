"""The end-of-run summary (printed, and saved as ``launch_summary.json``), from the Trainer's metrics and its log
history (which a checkpoint carries: after a resume it covers the whole run)."""

from __future__ import annotations

import math
from typing import Any


def run_summary(state: Any, metrics: dict[str, Any], first_step: int | None, **outcome: Any) -> dict[str, Any]:
    """``launch_summary.json``: ``train_loss`` is the whole run's mean (:func:`run_train_loss`), transformers' own
    (this process's steps) ``train_loss_this_process``; ``first_step``: the step this process started from."""
    history, metrics = state.log_history, dict(metrics)
    evals = [e for e in history if "eval_loss" in e] or [{}]
    train_loss, steps = run_train_loss(history)
    return {"global_step": state.global_step, "max_steps": state.max_steps, "interrupted": None, "checkpoint": None,
            "saved_to": None, "train_loss_this_process": metrics.pop("train_loss", None), "metrics": metrics,
            "first_eval_loss": evals[0].get("eval_loss"), "last_eval_loss": evals[-1].get("eval_loss"),
            "train_loss": train_loss, "last_train_loss": next((e["loss"] for e in reversed(history) if "loss" in e),
                                                              None),
            "steps_this_process": state.global_step - (state.global_step if first_step is None else first_step),
            "train_loss_steps": steps, "first_eval_step": evals[0].get("step"), "last_eval_step": evals[-1].get("step"),
            **outcome}


def _fmt(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


def run_train_loss(history: list[dict[str, Any]]) -> tuple[float | None, int]:
    """``(mean training loss over the steps the log history covers, how many steps)``, each logged mean weighed.

    >>> run_train_loss([{"loss": 4.0, "step": 10}, {"eval_loss": 3.0, "step": 10}, {"loss": 1.0, "step": 15}])
    (3.0, 15)
    """
    total = previous = 0
    for entry in history:
        if "loss" in entry and isinstance(entry.get("step"), int) and entry["step"] > previous:
            total += entry["loss"] * (entry["step"] - previous)
            previous = entry["step"]
    return (total / previous if previous else None), previous


def summary_lines(summary: dict[str, Any], padding_free: bool) -> list[str]:
    m, ran, step = summary["metrics"], summary.get("steps_this_process"), summary["global_step"]
    resumed = ran is not None and ran < step
    stopped = f" (stopped by {summary['interrupted']})" if summary.get("interrupted") else ""
    here = f", {ran} of them in this process (resumed at step {step - ran})," if resumed else ""
    tokens = m.get("train_real_tokens_per_second")
    lines = [f"steps: {step}/{summary['max_steps']}{here} in {m.get('train_runtime', 0.0):.1f} s{stopped}",
             f"real tokens/s: {'n/a' if tokens is None else f'{tokens:,.0f}'}" + (" (this process's steps)" * resumed)]
    if m.get("train_generation_seconds") is not None:  # GRPO / RLOO
        lines.append(f"generation: {m['train_generation_seconds']:.1f} s, "
                     f"{100 * m['train_generation_share']:.1f}% of the training time")
    if m.get("train_padding_share") is not None:
        lines.append(f"{'padding avoided' if padding_free else 'padding spent'}: "
                     f"{100 * m['train_padding_share']:.1f}% of the tokens a padded batch would have had")
    over = f"the run's {summary['train_loss_steps']} steps" if summary.get("train_loss_steps") is not None else "the run"
    lines.append(f"train loss: {_fmt(summary['train_loss'])} (mean over {over}), last logged "
                 f"{_fmt(summary['last_train_loss'])}")
    if summary.get("last_eval_loss") is not None:
        lines.append(eval_loss_line(summary))
    if summary.get("checkpoint"):
        lines.append(f"checkpoint saved to {summary['checkpoint']}; resume with --resume_from_checkpoint "
                     f"{summary['checkpoint']}")
    return lines + ([f"model saved to {summary['saved_to']}"] if summary.get("saved_to") else [])


def eval_loss_line(summary: dict[str, Any]) -> str:
    """The first and the last evaluation, each with its step.

    >>> eval_loss_line({"first_eval_loss": 2.5, "last_eval_loss": 0.0763, "first_eval_step": 0, "last_eval_step": 40})
    'eval loss: 2.5000 (step 0, before training) -> 0.0763 (step 40)'
    """
    def at(step: int | None) -> str:
        return "" if step is None else " (step 0, before training)" if step == 0 else f" (step {step})"

    first, last = summary.get("first_eval_step"), summary.get("last_eval_step")
    start = ("" if summary.get("first_eval_loss") is None or first == last
             else f"{_fmt(summary['first_eval_loss'])}{at(first)} -> ")
    return f"eval loss: {start}{_fmt(summary.get('last_eval_loss'))}{at(last)}"
