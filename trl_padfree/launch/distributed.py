"""How a multi-process ``trl-padfree train`` starts and ends (torchrun, ``accelerate launch``).

- :func:`check_process_group`: a launcher that started several processes which did not join one process group
  (on a machine without GPUs, accelerate and the Trainer only build one over gloo when ``use_cpu: true``) would
  train N independent copies of the model into the same ``output_dir``; this stops the run before anything is
  written, naming the fix. So does an FSDP config on the CPU, where accelerate silently trains plain DDP instead
  (it only shards on GPU-like devices).
- :func:`finish`: every way out of a run ends the process group. On success (a finished run, or one stopped by
  SIGTERM with a checkpoint) all ranks meet at a barrier and destroy the group with :func:`end_process_group`. On
  failure a rank leaves at once
  with ``os._exit`` after flushing its output: no collective (the others may be inside a different one) and no
  destructor. Its sockets close, so every other rank's next or pending collective fails within milliseconds
  ("Connection closed by peer") and that rank exits non-zero too. torchrun then also stops the remaining workers
  (SIGTERM, then SIGKILL after its grace period) and exits non-zero.

The hang this avoids (seen with torch 2.13, gloo, under CPU contention; stacks taken with py-spy): the C++
destructor of ``ProcessGroupGloo`` joins its worker threads while the thread running it holds the GIL (it runs when
the last reference goes, e.g. from DDP's ``Reducer`` being freed after ``Trainer.end()`` /
``destroy_process_group()`` has dropped the registry's reference). A worker thread that is just destroying a
finished barrier/all-reduce work releases that work's tensors, which needs the GIL: both wait forever.
``destroy_process_group`` itself does not join the threads (``shutdown`` leaves them running); only the
destructor does. :func:`end_process_group` therefore keeps one reference to the group's C++ object, so that
destructor never runs; the process is about to exit and the operating system reclaims the threads.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import time
import traceback
from typing import Any

from ..messages import one_line
from .config import ConfigError

__all__ = [
    "check_process_group",
    "describe_distribution",
    "end_process_group",
    "finish",
    "fsdp_requested",
    "launcher_world_size",
]


def launcher_world_size() -> int:
    """The number of processes the launcher says it started (``WORLD_SIZE``; 1 when there is no launcher)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def describe_distribution(training: Any) -> dict[str, Any]:
    """``world_size``, ``distributed_type`` (accelerate's) and ``backend`` of the run, for the summary."""
    state = getattr(training, "distributed_state", None)
    kind = getattr(state, "distributed_type", None)
    return {
        "world_size": int(training.world_size),
        "distributed_type": getattr(kind, "value", None) or (str(kind) if kind is not None else "NO"),
        "backend": getattr(state, "backend", None),
    }


def fsdp_requested(training: Any) -> bool:
    """Whether FSDP was asked for: an accelerate FSDP config (``ACCELERATE_USE_FSDP``) or the ``fsdp`` field."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" or bool(getattr(training, "fsdp", None))


def check_process_group(training: Any) -> None:
    """Raise :class:`ConfigError` when the launcher started several processes that are not one process group, or
    when FSDP was asked for where accelerate would silently run without it (CPU: plain DDP, or one process)."""
    started = launcher_world_size()
    if started > 1 and int(training.world_size) == 1:
        raise ConfigError(
            f"the launcher started {started} processes (WORLD_SIZE={started}) but they did not join one process "
            "group, so each would train its own copy of the model: on a machine without GPUs set use_cpu: true "
            "(then they train as one DDP run over gloo), or start a single process"
        )
    kind = describe_distribution(training)["distributed_type"]
    if fsdp_requested(training) and kind in ("MULTI_CPU", "NO"):
        raise ConfigError(
            "FSDP was requested (an accelerate FSDP config or the fsdp field) but this run is on the CPU, where "
            f"accelerate does not shard: it would silently train without FSDP ({kind}). Use "
            "configs/accelerate/cpu-ddp.yaml for DDP on CPU (or DeepSpeed, which runs on CPU), or run FSDP on GPUs"
        )


def _group_initialized() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return False
    return dist.is_available() and dist.is_initialized()


def end_process_group() -> None:
    """Barrier, then destroy the default process group without ever running its C++ destructor (see the module
    docstring: that destructor can deadlock with the group's own worker threads). Call it once, at the very end."""
    import torch.distributed as dist

    world = getattr(dist.distributed_c10d, "_world", None)
    groups = list(getattr(world, "pg_map", None) or [dist.group.WORLD])  # every registered group (private map)
    dist.barrier()
    time.sleep(0.05)  # let the worker threads release their finished works (they need the GIL for that)
    for group in groups:  # never freed: their destructors would join those threads
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))
    dist.destroy_process_group()


def _leave_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def finish(code: int, error: BaseException | None = None) -> int:
    """End the process group (if any) for a run that returned ``code``; see the module docstring.

    Returns ``code`` where the process may exit normally; does not return for a failed rank of a multi-process
    run (``os._exit``). ``error``, when given, is printed (with its traceback) before leaving.
    """
    if not _group_initialized():
        if error is not None:
            raise error
        return code
    import torch.distributed as dist

    rank = dist.get_rank()
    if code == 0 and error is None:
        try:
            gc.collect()  # free the trainer (and DDP's reducer) while the group is still registered
            end_process_group()
            return 0
        except Exception as exc:  # another rank failed: leave as well, non-zero
            print(f"[trl-padfree] rank {rank}: another process of the run failed ({one_line(exc, limit=200)}); "
                  "exiting with code 1", file=sys.stderr, flush=True)
            _leave_now(1)
    if error is not None:
        print(f"[trl-padfree] rank {rank} failed:", file=sys.stderr)
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    _leave_now(code or 1)
    return code  # pragma: no cover  (os._exit does not return)
