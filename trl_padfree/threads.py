"""The CPU thread policy: how many torch threads a training process uses (:func:`threads_default`), for the
trainers (``torch_num_threads="auto"``) and the launch (:mod:`trl_padfree.launch.defaults`).

The cores this process may use, divided by the processes on this machine; on CPU at most one thread per
:data:`HIDDEN_PER_THREAD` units of hidden size (small matrices do not split well: the demo model trains 10x faster
on 1 thread than on 2 on a busy 2-core machine), and with one process no more than the idle cores
(:func:`idle_cores`: a thread waiting for a busy core stalls every matrix product). A count the user chose wins
(``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``, or ``torch.set_num_threads``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import torch

# torch's count at import is its default unless OMP_NUM_THREADS / MKL_NUM_THREADS set one (then: the usable cores)
_CHOSEN = bool(os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS"))
_TORCH_DEFAULT = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) \
    if _CHOSEN else torch.get_num_threads()

__all__ = ["HIDDEN_PER_THREAD", "cores", "idle_cores", "processes_on_this_machine",
           "threads_default", "torch_default_threads", "torch_threads", "training_threads"]

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
    """CPU cores this process may use: torch's own default (physical cores), within the CPU affinity."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(allowed, torch.get_num_threads()))


def _cpu_times() -> tuple[float, float] | None:
    """``(idle, total)`` jiffies of all CPUs from ``/proc/stat`` (Linux), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = [float(x) for x in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[3] + (fields[4] if len(fields) > 4 else 0.0), sum(fields)) if len(fields) >= 4 else None


def idle_cores(interval: float = 0.25) -> float | None:
    """The cores of this machine that no process used over the last ``interval`` seconds (``/proc/stat``; else the
    1-minute load average), or None where neither can be read.

    >>> 0.0 <= idle_cores() <= (os.cpu_count() or 1)
    True
    """
    count = os.cpu_count() or 1
    before = _cpu_times()
    if before is not None:
        time.sleep(interval)
        after = _cpu_times()
        if after is not None and after[1] > before[1]:
            return count * (after[0] - before[0]) / (after[1] - before[1])
    try:
        return max(0.0, count - os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def processes_on_this_machine() -> int:
    """The training processes on this machine (torchrun's ``LOCAL_WORLD_SIZE``; 1 without it)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)


def torch_default_threads() -> int:
    """The CPU thread count torch had when this module was imported: its default (the physical cores) unless a
    count was chosen before.

    >>> torch_default_threads() >= 1
    True
    """
    return _TORCH_DEFAULT


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
    processes = processes_on_this_machine()
    threads = threads_default(device, hidden, cores(), processes)
    if device == "cpu" and hidden:
        why = f"training on the CPU, hidden size {hidden}: one thread per {HIDDEN_PER_THREAD}"
    else:
        why = "the cores per process"
    if device == "cpu" and processes == 1 and threads > 1:
        idle = idle_cores()
        if idle is not None and int(idle + 0.5) < threads:
            why += f", at most {threads}; {idle:.1f} of {os.cpu_count()} cores idle now"
            threads = max(1, int(idle + 0.5))
    return threads, why


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch CPU threads (None: leave torch's choice), restoring the previous count afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n or previous)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
