"""Several processes (torchrun, ``accelerate launch``, DeepSpeed) on public torch APIs: refusals shared once the
process group exists, runs refused that would not be one group, and the end (docs/distributed.md)."""

from __future__ import annotations

import gc
import os
import sys
import traceback
from typing import Any

from .config import ConfigError, RefusedElsewhere
from .console import where

__all__ = ["agree_on_config", "any_process", "check_process_group", "describe_distribution", "finish",
           "gather_reports", "in_process_group", "plan_nodes", "restart_attempt"]


def in_process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def restart_attempt() -> int:
    """torchrun's ``TORCHELASTIC_RESTART_COUNT`` on this node (0 outside torchrun or on the first attempt).

    >>> restart_attempt()
    0
    """
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is set on any process (an all-reduce when distributed), so that all take the same path."""
    if not in_process_group():
        return flag
    import torch
    import torch.distributed as dist

    on_gpu = dist.get_backend() != "gloo"
    tensor = torch.tensor([int(flag)], device=torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def gather_reports(report: Any) -> list[tuple[int, str, Any]]:
    """``(rank, where, report)`` of every process whose ``report`` is not None, in rank order; every process of the
    group must call it (outside one: this process's report alone)."""
    if not in_process_group():
        return [] if report is None else [(0, where(), report)]
    import torch.distributed as dist

    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, None if report is None else (where(), report))
    return [(rank, *view) for rank, view in enumerate(views) if view is not None]


def agree_on_config(error: ConfigError | None) -> None:
    """Every process, once its config is parsed (``error``: why it was refused): with a process group, a rank whose
    config was accepted raises :class:`RefusedElsewhere` naming the refusing ranks, so that every rank exits 2."""
    if isinstance(error, RefusedElsewhere) or not in_process_group():
        return
    refusals = gather_reports(None if error is None else str(error))
    if refusals and error is None:
        shown = "; ".join(f"rank {rank} ({place}): {message}" for rank, place, message in refusals)
        raise RefusedElsewhere(f"the config was refused on another process of the run, {shown}")


def plan_nodes(cfg: Any) -> tuple[Any, str | None]:
    """``(cfg with rank 0's run id, the layout in words)``, ranks that would resume different steps refused; one
    process: ``(cfg, None)``."""
    import dataclasses

    if not in_process_group():
        return cfg, None
    import torch.distributed as dist

    resume = cfg.resume_from_checkpoint
    step = None if resume is None else os.path.basename(os.path.normpath(str(resume)))
    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, (cfg.run_id, step, os.environ.get("GROUP_RANK", "0")))
    if len({view[1] for view in views}) > 1:
        shown = "; ".join(f"rank {rank}: {view[1] or 'a new run'}" for rank, view in enumerate(views))
        raise ConfigError(f"the processes do not resume the same checkpoint ({shown}): pass a checkpoint every "
                          "node holds as resume_from_checkpoint: PATH (docs/distributed.md)")
    nodes = len({view[2] for view in views})
    writes = ("the first process of every node writes (save_on_each_node)" if cfg.training.save_on_each_node
              else "global rank 0 writes")
    layout = f"{len(views)} processes on {nodes} node{'s' if nodes > 1 else ''}: {writes}"
    return dataclasses.replace(cfg, run_id=views[0][0]), layout


def describe_distribution(training: Any) -> dict[str, Any]:
    """``world_size``, ``distributed_type`` (accelerate's) and ``backend`` of the run, for the summary."""
    world_size = int(training.world_size)  # (sets up training.distributed_state)
    state = training.distributed_state
    return {"world_size": world_size, "distributed_type": state.distributed_type.value, "backend": state.backend}


def check_process_group(training: Any) -> None:
    """Refuse processes that are not one process group, and FSDP where accelerate would silently run without it."""
    started = os.environ.get("WORLD_SIZE", "1")
    if started.isdigit() and int(started) > 1 and int(training.world_size) == 1:
        raise ConfigError(
            f"the launcher started {started} processes (WORLD_SIZE={started}) but they did not join one process "
            "group, so each would train its own copy of the model: on a machine without GPUs set use_cpu: true "
            "(then they train as one DDP run over gloo), or start a single process")
    kind = describe_distribution(training)["distributed_type"]
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" or bool(getattr(training, "fsdp", None))
    if fsdp and kind in ("MULTI_CPU", "NO"):
        raise ConfigError(
            "FSDP was requested (an accelerate FSDP config or the fsdp field) but this run is on the CPU, where "
            f"accelerate does not shard: it would silently train without FSDP ({kind}). Use "
            "configs/accelerate/cpu-ddp.yaml for DDP on CPU (or DeepSpeed, which runs on CPU), or run FSDP on GPUs")


def finish(code: int, error: BaseException | None = None) -> int:
    """The exit code of a run that returned ``code`` (``error``: what stopped it; raised without a process group).
    With one, a finished run meets the others at a barrier and destroys the group, a refused one (2) destroys it
    without a collective; a failed rank leaves without a collective: its sockets close when it exits, so every other
    rank's pending collective fails too."""
    if not in_process_group():
        if error is not None:
            raise error
        return code
    import torch.distributed as dist

    if code == 0 and error is None:
        gc.collect()  # free the trainer (and DDP's reducer) while the group still exists
        try:
            dist.barrier()
            dist.destroy_process_group()
            return 0
        except Exception as exc:  # noqa: BLE001  (another rank failed meanwhile)
            error = exc
    if code == 2 and error is None:
        # refused before training (no DDP holds the group): destroy it here, without a collective. Left to the
        # interpreter's exit, the group's threads could abort the process under load ("terminate called without an
        # active exception", exit -6 instead of 2), and torchrun then reported that
        gc.collect()
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001,S110  (the exit code says it all)
            pass
        sys.stderr.flush()
        return 2
    if error is not None:
        print(f"[trl-padfree] rank {dist.get_rank()} ({where()}) failed:", file=sys.stderr)
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    sys.stderr.flush()
    return code or 1
