"""Several processes (torchrun, ``accelerate launch``, DeepSpeed) on public torch APIs: one run id for the run,
runs refused that would not be one group, and the end (docs/distributed.md)."""

from __future__ import annotations

import gc
import os
import sys
import traceback
from typing import Any

from .config import ConfigError


def in_process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def gather(value: Any) -> list[Any]:
    """Every process's ``value`` in rank order (every process of the group must call it; outside one: ``[value]``)."""
    if not in_process_group():
        return [value]
    import torch.distributed as dist

    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def plan_nodes(cfg: Any) -> tuple[Any, str | None]:
    """``(cfg with rank 0's run id, the layout in words)``; one process: ``(cfg, None)``."""
    if not in_process_group():
        return cfg, None
    views = gather((cfg.run_id, os.environ.get("GROUP_RANK", "0")))
    nodes = len({node for _, node in views})
    writes = ("the first process of every node writes (save_on_each_node)" if cfg.training.save_on_each_node
              else "global rank 0 writes")
    layout = f"{len(views)} processes on {nodes} node{'s' if nodes > 1 else ''}: {writes}"
    cfg.run_id = views[0][0]
    return cfg, layout


def describe_distribution(training: Any) -> dict[str, Any]:
    world_size, state = int(training.world_size), training.distributed_state  # (world_size sets the state up)
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
    With one, a finished run meets the others at a barrier and destroys the group; a refused one (2, before
    training) destroys it without a collective (left to the interpreter's exit, its threads could abort the process,
    exit -6); a failed rank leaves without a collective: its sockets close, so every other rank's collective fails."""
    if not in_process_group():
        if error is not None:
            raise error
        return code
    import torch.distributed as dist

    if code in (0, 2) and error is None:
        gc.collect()  # free the trainer (and DDP's reducer) while the group still exists
        try:
            if code == 0:
                dist.barrier()
            dist.destroy_process_group()
        except Exception as exc:  # noqa: BLE001  (another rank failed meanwhile)
            error = exc if code == 0 else None
    if error is not None:
        place = f"node {os.environ.get('GROUP_RANK', '0')}, local rank {os.environ.get('LOCAL_RANK', '0')}"
        print(f"[trl-padfree] rank {dist.get_rank()} ({place}) failed:", file=sys.stderr)
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    sys.stderr.flush()
    return code or (1 if error is not None else 0)
