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

import contextlib
import ctypes
import gc
import os
import sys
import time
import traceback
from typing import Any

from .._torch_private import pg_timeout_setter, registered_groups
from ..exception_text import one_line
from .config import ConfigError
from .console import where

__all__ = [
    "check_process_group",
    "describe_distribution",
    "end_process_group",
    "finish",
    "fsdp_requested",
    "launcher_world_size",
    "plan_nodes",
]


def _apply_timeout(seconds: int) -> None:
    """Make ``ddp_timeout`` the default process group's timeout: how long a collective waits for a process that
    does not answer (stopped, hung, on a dead node) before it fails. transformers 5.24 passes ``ddp_timeout`` to
    the process group on GPUs only; with ``use_cpu`` the group kept torch's 30 minutes (measured: a rank stopped
    with SIGSTOP held the others for as long as the run was left, ``--ddp_timeout 10`` notwithstanding)."""
    from datetime import timedelta

    setter = pg_timeout_setter()  # torch >= 2.3
    if setter is not None and seconds:
        setter(timedelta(seconds=seconds))
        _TIMEOUT.append(float(seconds))


def _node_id() -> str:
    """This process's node: torchrun's ``GROUP_RANK`` (also on one machine), else the host name."""
    import socket

    return os.environ.get("GROUP_RANK") or socket.gethostname()


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(os.path.expanduser(path))
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _output_dir_shared(output_dir: str) -> list[tuple[str, bool]]:
    """``(node, sees rank 0's marker)`` of every rank: rank 0 writes a marker file in ``output_dir`` (or the nearest
    directory above it that exists, so that nothing is created), every rank whose ``output_dir`` is the same path
    looks for it in its own view of that path after a barrier, then rank 0 removes it."""
    import uuid

    import torch.distributed as dist

    path = os.path.realpath(os.path.expanduser(output_dir))
    token = [(uuid.uuid4().hex, path) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(token, src=0)
    name = f".trl_padfree_node_probe-{token[0][0]}"
    marker = os.path.join(_nearest_existing(output_dir), name)
    error = None
    if dist.get_rank() == 0:
        try:
            with open(marker, "w", encoding="utf-8") as handle:
                handle.write("written by global rank 0 to see which nodes share output_dir; removed at once\n")
        except OSError as exc:
            error = exc
    dist.barrier()
    # another path is another directory, even on the same filesystem: the nodes then write apart
    seen = path == token[0][1] and os.path.exists(os.path.join(_nearest_existing(output_dir), name))
    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, (_node_id(), seen))
    if dist.get_rank() == 0:
        with contextlib.suppress(OSError):
            os.unlink(marker)
    if error is not None:
        raise ConfigError(f"output_dir {output_dir!r}: could not write a file there ({error})")
    return views


def plan_nodes(cfg: Any) -> tuple[Any, str | None]:
    """Decide who writes what when the run spans several processes, and agree on the run and its checkpoint.

    - One node: as before (the main process writes; ``save_on_each_node`` as configured).
    - Several nodes that see one ``output_dir`` (a shared filesystem): global rank 0 alone writes
      (``save_on_each_node`` off: two nodes writing the same files at once would corrupt them).
    - Several nodes, each with its own ``output_dir`` (separate disks): the first process of every node writes
      checkpoints, the final model and the run record to its own disk (``save_on_each_node``), so that
      ``resume_from_checkpoint: true`` / ``auto`` works on every node.
    - Some nodes sharing and some not: refused (ConfigError).

    Every rank takes rank 0's run id (a new run), and a resumed run continues from the newest step whose checkpoint
    is complete on every node. Returns the config resolved so (``cfg`` is not changed) and the text for the run
    line (None with a single process).
    """
    import dataclasses

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return cfg, None
    from .config import with_fields
    from .run_files import complete_steps

    training = cfg.training
    _apply_timeout(training.ddp_timeout)
    views = _output_dir_shared(training.output_dir)
    nodes = sorted({node for node, _ in views})
    first = {node for node, seen in views if node == views[0][0]}
    seeing = {node for node, seen in views if seen}
    if len(nodes) == 1:
        layout = f"{len(views)} processes on 1 node: rank 0 writes"
    elif seeing == set(nodes):
        if training.save_on_each_node:
            cfg = dataclasses.replace(cfg, notes=[
                *cfg.notes, "save_on_each_node: true is ignored: output_dir is shared by the nodes (one filesystem), "
                "where every node would write the same files at once"])
        cfg = dataclasses.replace(cfg, training=with_fields(training, save_on_each_node=False))
        layout = f"{len(views)} processes on {len(nodes)} nodes, output_dir shared: global rank 0 writes"
    elif seeing == first:
        cfg = dataclasses.replace(cfg, training=with_fields(training, save_on_each_node=True))
        layout = (f"{len(views)} processes on {len(nodes)} nodes, output_dir not shared: the first process of every "
                  "node writes to its own output_dir (save_on_each_node)")
    else:
        raise ConfigError(
            f"output_dir {training.output_dir!r} is shared by some nodes but not others ({', '.join(sorted(seeing))} "
            f"see global rank 0's files, {', '.join(n for n in nodes if n not in seeing)} do not): use one shared "
            "filesystem for all nodes, or a separate disk on each"
        )
    return dataclasses.replace(cfg, **_agree_on_run(cfg, complete_steps)), layout


def _agree_on_run(cfg: Any, complete_steps: Any) -> dict[str, Any]:
    """Every rank trains the same run from the same step (see :func:`plan_nodes`): the fields of ``cfg`` to change
    (``run_id``, and ``resume_from_checkpoint`` with a note where another step is taken) and their values."""
    import torch.distributed as dist

    resume = cfg.resume_from_checkpoint
    output_dir = os.path.abspath(cfg.training.output_dir)
    inside = resume is not None and os.path.dirname(os.path.abspath(str(resume))) == output_dir
    mine = (cfg.run_id, None if resume is None else os.path.basename(os.path.normpath(str(resume))), inside,
            complete_steps(output_dir, cfg.run_id) if inside else [])
    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, mine)
    run_id = views[0][0]
    if all(name is None for _, name, _, _ in views):
        return {"run_id": run_id}  # a new run: rank 0's id everywhere (each node's markers and run record agree)

    def listing(show: Any) -> str:
        return "; ".join(f"rank {rank}: {show(view)}" for rank, view in enumerate(views))

    if any(name is None for _, name, _, _ in views) or (
        all(inside for _, _, inside, _ in views) and len({view[0] for view in views}) > 1
    ):
        raise ConfigError(
            "the processes do not resume the same run ("
            + listing(lambda v: f"run {v[0]} from {v[1]}" if v[1] else "a new run")
            + "): each node's output_dir must hold the same run, resumed with the same resume_from_checkpoint"
        )
    if len({name for _, name, _, _ in views}) == 1:  # the same checkpoint everywhere (as asked, or as chosen)
        return {"run_id": run_id}
    if not all(inside for _, _, inside, _ in views):  # checkpoint paths elsewhere that differ
        raise ConfigError("the processes resume different checkpoints (" + listing(lambda v: v[1]) + ")")
    common = set.intersection(*(set(steps) for _, _, _, steps in views))
    if not common:
        raise ConfigError("no checkpoint of this run is complete on every node ("
                          + listing(lambda v: ", ".join(f"checkpoint-{s}" for s in v[3]) or "none") + ")")
    step = max(common)
    path = os.path.join(cfg.training.output_dir, f"checkpoint-{step}")
    if os.path.abspath(str(resume)) == os.path.abspath(path):
        return {"run_id": run_id}
    return {"run_id": run_id, "resume_from_checkpoint": path, "notes": [
        *cfg.notes, f"resuming from {path} instead of {resume}: step {step} is the newest checkpoint complete on "
        "every node"]}


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

    groups = registered_groups()  # every registered group (torch's private map)
    dist.barrier()
    time.sleep(0.05)  # let the worker threads release their finished works (they need the GIL for that)
    for group in groups:  # never freed: their destructors would join those threads
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))
    dist.destroy_process_group()


_TIMEOUT: list[float] = []  # the process group's timeout set by _apply_timeout (seconds)


def _timeout_seconds() -> float | None:
    """The default process group's timeout (``ddp_timeout``) in seconds, once :func:`plan_nodes` set it."""
    return _TIMEOUT[-1] if _TIMEOUT else None


def lost_contact(error: BaseException) -> str | None:
    """The one-line cause when ``error`` is a collective that failed because another process of the run is gone
    (killed, crashed) or did not answer within the process group's timeout (``ddp_timeout``: stopped, hung, too
    slow); None for any other error (that one is printed with its traceback)."""
    text = one_line(error, limit=None)
    detail = text[:240]
    if "closed by peer" in text or "reset by peer" in text or "Broken pipe" in text or "Connection refused" in text:
        return f"another process of the run is gone (killed or crashed; gloo: {detail})"
    if "Timed out" in text or "timed out" in text or "Timeout" in text or "DistStoreError" in type(error).__name__:
        seconds = _timeout_seconds()
        limit = f"ddp_timeout={seconds:g} s" if seconds else "the process group's timeout (ddp_timeout)"
        return (f"a collective did not complete within {limit}: another process of the run is stopped, hung or too "
                f"slow ({detail})")
    return None


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
            print(f"[trl-padfree] rank {rank} ({where()}): another process of the run failed ({one_line(exc, limit=200)}); "
                  "exiting with code 1", file=sys.stderr, flush=True)
            _leave_now(1)
    lost = lost_contact(error) if error is not None else None
    if lost is not None:
        print(f"[trl-padfree] rank {rank} ({where()}): {lost}; exiting with code 1", file=sys.stderr, flush=True)
    elif error is not None:
        print(f"[trl-padfree] rank {rank} failed:", file=sys.stderr)
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    _leave_now(code or 1)
    return code  # pragma: no cover  (os._exit does not return)
