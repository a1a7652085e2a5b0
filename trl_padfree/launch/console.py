"""Console output of the launch: messages and one-line errors from the first process of each node."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator


def is_main_process() -> bool:
    """True on the process that logs for its node (``LOCAL_RANK`` 0), also before distribution is set up."""
    return int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))) == 0


def say(message: str) -> None:
    if is_main_process():
        print(f"[trl-padfree] {message}", flush=True)


def quiet_replicas() -> None:
    """Silence library logging, warnings and progress bars on every process but the main one."""
    if not is_main_process():
        import datasets
        import transformers

        transformers.logging.set_verbosity_error()
        datasets.logging.set_verbosity_error()
        datasets.disable_progress_bars()
        warnings.filterwarnings("ignore")


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """No progress bars from datasets / transformers loading (the stages print one line each instead)."""
    import datasets
    from transformers.utils import logging

    enable = [on for was, on in ((datasets.is_progress_bar_enabled(), datasets.enable_progress_bars),
                                 (logging.is_progress_bar_enabled(), logging.enable_progress_bar)) if was]
    datasets.disable_progress_bars()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        for on in enable:
            on()
