"""The pre-flight packing probe: do packed examples stay apart under the loaded model? A leak on any process is a
:class:`~.config.ConfigError` on every process before anything is written."""

from __future__ import annotations

from typing import Any

from .config import ConfigError
from .console import is_main_process, say
from .distributed import any_process
from .model import materialized, sharded_launch

__all__ = ["probe_model"]


def probe_model(model: Any, training: Any, check: Any = None) -> None:
    """Raise :class:`ConfigError` if packed examples leak, judged at the training precision on the training device;
    a process without real weights (FSDP, ZeRO-3) skips it. ``check``: the task's probe (default SFT's)."""
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
