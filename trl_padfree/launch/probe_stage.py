"""The pre-flight packing probe of ``trl-padfree train``: do packed examples stay apart under the loaded model?

Runs :func:`trl_padfree.probe.assert_packing_safe` on every process that holds the model's weights; a leak is bad
input and raises :class:`~.config.ConfigError` on every process before anything is written.
"""

from __future__ import annotations

from typing import Any

from .config import ConfigError
from .console import is_main_process, say
from .distributed import any_process
from .model import materialized, sharded_launch

__all__ = ["probe_model"]


def _failed_anywhere(failure: str | None) -> str | None:
    """Share a probe failure between processes, so that every rank stops (none waits in a collective)."""
    if any_process(failure is not None) and failure is None:
        return "padding-free training is unsafe for this model (the packing probe failed on another process)"
    return failure


def probe_model(model: Any, training: Any, check: Any = None) -> None:
    """Raise :class:`ConfigError` if packed examples leak under the model's attention implementation.

    Judged at the training precision (bf16/fp16 mixed precision gets that dtype's tolerance), on the training
    device where the Trainer would put the model anyway. A process that holds no real weights (FSDP loading on
    rank 0 only, DeepSpeed ZeRO-3 shards) skips the probe; any process's failure stops every process. ``check``:
    the probe to run (default :func:`~trl_padfree.probe.assert_packing_safe`; ``trl-padfree dpo`` passes the
    preference probe, :func:`~trl_padfree.preference_probe.assert_preference_packing_safe`).
    """
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
    failure = _failed_anywhere(failure)
    if failure is not None:
        raise ConfigError(failure)
