"""The CPU thread policy: how many torch threads a training process uses, in one place.

Both :class:`trl_padfree.SFTTrainer` / :class:`trl_padfree.DPOTrainer` (``torch_num_threads="auto"``) and
``trl-padfree train|dpo`` (:mod:`trl_padfree.launch.defaults`) take their count from :func:`threads_default`:

- on CUDA, the cores this process may use (torch's default count, within the CPU affinity) divided by the processes
  on this machine (torch would give each process every core);
- on CPU, additionally one thread per :data:`HIDDEN_PER_THREAD` (256) units of the model's hidden size, since the
  matrices of small models are too small to split across threads (the demo model, hidden size 128, trains 10x
  faster on 1 thread than on 2 on a busy 2-core machine).

A count the user chose wins: ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` in the environment, or a
``torch.set_num_threads`` call with another count than torch's default.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "HIDDEN_PER_THREAD",
    "checked_threads",
    "cores",
    "processes_on_this_machine",
    "threads_default",
    "torch_default_threads",
    "torch_threads",
    "training_threads",
]

#: On CPU, one torch thread per this many units of hidden size (at least 1, at most the cores per process).
HIDDEN_PER_THREAD = 256


def threads_default(device: str, hidden_size: int | None, cores: int, processes: int = 1) -> int:
    """The torch thread count for one process (see the module docstring).

    >>> threads_default("cpu", 128, cores=16)     # the demo model: 1 thread
    1
    >>> threads_default("cpu", 896, cores=16), threads_default("cpu", 4096, cores=16, processes=2)
    (3, 8)
    >>> threads_default("cuda", 128, cores=16, processes=4), threads_default("cpu", None, cores=2)
    (4, 2)
    """
    per_process = max(1, cores // max(1, processes))
    if device != "cpu" or not hidden_size:
        return per_process
    return max(1, min(per_process, hidden_size // HIDDEN_PER_THREAD))


def cores() -> int:
    """CPU cores this process may use: torch's own default (physical cores), within the CPU affinity.

    >>> cores() >= 1
    True
    """
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        allowed = os.cpu_count() or 1
    return max(1, min(allowed, torch.get_num_threads()))


def processes_on_this_machine() -> int:
    """The training processes on this machine (torchrun's ``LOCAL_WORLD_SIZE``; 1 without it)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)


def torch_default_threads() -> int:
    """The CPU thread count torch starts with when no environment variable sets one: the physical cores.

    >>> torch_default_threads() >= 1
    True
    """
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def training_threads(model: Any, device: str) -> tuple[int | None, str]:
    """``(torch thread count to train with, why)``; None when the user chose one (see the module docstring)."""
    if os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS"):
        return None, "OMP_NUM_THREADS / MKL_NUM_THREADS is set"
    if torch.get_num_threads() != torch_default_threads():
        return None, "torch.set_num_threads() was called"
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    hidden = getattr(text, "hidden_size", None)
    hidden = hidden if isinstance(hidden, int) else None
    threads = threads_default(device, hidden, cores(), processes_on_this_machine())
    if device == "cpu" and hidden:
        why = f"training on the CPU, hidden size {hidden}: one thread per {HIDDEN_PER_THREAD}"
    else:
        why = "the cores per process"
    return threads, why


def checked_threads(value: int | str | None) -> int | str | None:
    """A ``torch_num_threads`` argument: ``"auto"``, a positive integer or None (else a ``ValueError``).

    >>> checked_threads("auto"), checked_threads(2), checked_threads(None)
    ('auto', 2, None)
    >>> checked_threads(0)
    Traceback (most recent call last):
    ...
    ValueError: torch_num_threads must be 'auto', a positive integer or None, got 0
    """
    if value is not None and value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"torch_num_threads must be 'auto', a positive integer or None, got {value!r}")
    return value


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch CPU threads (None: leave torch's choice), restoring the previous count afterwards.

    >>> before = torch.get_num_threads()
    >>> with torch_threads(1):
    ...     torch.get_num_threads()
    1
    >>> torch.get_num_threads() == before
    True
    """
    if n is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
