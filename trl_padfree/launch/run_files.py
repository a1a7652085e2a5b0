"""What a run of the launch leaves in ``output_dir``, and how to tell that a checkpoint there is complete.

- ``trl_padfree_run.json`` (:data:`RUN_FILE`): the run's id and status (``training``, ``interrupted``,
  ``finished``, ``failed``), written atomically at the start and at the end of the run (:mod:`.run_record`);
- ``checkpoint-N/``: written first under ``.trl_padfree_partial/checkpoint-N`` (:data:`STAGING_DIR`), then
  completed with ``trl_padfree_checkpoint.json`` (:data:`CHECKPOINT_MARKER`: the run id, the step and the size of
  every file), synced to disk and renamed into place (:mod:`.atomic_save`). A run killed while saving leaves its
  partial files in the staging directory only; ``checkpoint-N`` appears complete or not at all.
- the final model: saved the same way (staging directory, then each file moved into ``output_dir``), so a save
  that fails (disk full) leaves no truncated weights behind.

``resume_from_checkpoint: true`` (:mod:`.resume`) takes the newest checkpoint that :func:`checkpoint_problem` finds
nothing wrong with.
"""

from __future__ import annotations

import os
import re

from .files import read_json

__all__ = [
    "CHECKPOINT_MARKER",
    "CHECKPOINT_NAME",
    "RUN_FILE",
    "STAGING_DIR",
    "checkpoint_problem",
    "complete_steps",
    "last_complete_checkpoint",
    "list_checkpoints",
    "run_contents",
]

RUN_FILE = "trl_padfree_run.json"
CHECKPOINT_MARKER = "trl_padfree_checkpoint.json"
STAGING_DIR = ".trl_padfree_partial"

CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
#: Files that hold a checkpoint's model weights (any one of them, or a sharded index).
_WEIGHTS = ("model.safetensors", "adapter_model.safetensors", "pytorch_model.bin", "adapter_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
#: What in an output_dir shows that a training run wrote there.
_RUN_MARKS = (RUN_FILE, "trainer_state.json", "launch_summary.json", *_WEIGHTS, *_INDEXES)


def list_checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """``(step, path)`` of every ``checkpoint-N`` directory in ``output_dir``, by step."""
    try:
        names = os.listdir(output_dir)
    except OSError:
        return []
    found = []
    for name in names:
        match = CHECKPOINT_NAME.match(name)
        path = os.path.join(output_dir, name)
        if match and os.path.isdir(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def checkpoint_problem(path: str, run_id: str | None = None) -> str | None:
    """Why ``path`` is not a complete checkpoint (of run ``run_id``, when given), or None if it is one.

    A checkpoint written by this launcher must carry its marker and every file the marker lists, at the listed
    size; one written by another tool (no marker) must have a readable ``trainer_state.json`` and model weights.
    """
    if not os.path.isdir(path):
        return "not a directory"
    marker = read_json(os.path.join(path, CHECKPOINT_MARKER))
    if marker is not None:
        if run_id is not None and marker.get("run_id") != run_id:
            return "written by another run"
        for rel, size in (marker.get("files") or {}).items():
            full = os.path.join(path, rel)
            if not os.path.isfile(full):
                return f"{rel} is missing"
            if os.path.getsize(full) != size:
                return f"{rel} is {os.path.getsize(full)} bytes, {size} were written"
        return None
    if run_id is not None:
        return "incomplete (no trl-padfree completion marker: the save was interrupted, or another tool wrote it)"
    state = read_json(os.path.join(path, "trainer_state.json"))
    if state is None or not isinstance(state.get("global_step"), int):
        return "it has no readable trainer_state.json (the save was interrupted?)"
    weights = [name for name in _WEIGHTS if os.path.isfile(os.path.join(path, name))]
    indexes = [name for name in _INDEXES if os.path.isfile(os.path.join(path, name))]
    if not weights and not indexes and not any(n.startswith("pytorch_model_fsdp") for n in os.listdir(path)):
        return "it holds no model weights (model.safetensors, adapter_model.safetensors, ...)"
    for name in weights:
        if os.path.getsize(os.path.join(path, name)) == 0:
            return f"{name} is empty"
    for name in indexes:
        index = read_json(os.path.join(path, name)) or {}
        for shard in set((index.get("weight_map") or {}).values()):
            if not os.path.isfile(os.path.join(path, shard)):
                return f"the shard {shard} listed in {name} is missing"
    return None


def last_complete_checkpoint(output_dir: str, run_id: str | None) -> str | None:
    """The newest complete checkpoint of run ``run_id`` in ``output_dir``, or None."""
    for _, path in reversed(list_checkpoints(output_dir)):
        if run_id is not None and checkpoint_problem(path, run_id) is None:
            return path
    return None


def complete_steps(output_dir: str, run_id: str | None) -> list[int]:
    """The steps of every complete checkpoint of run ``run_id`` in ``output_dir`` (ascending)."""
    return [step for step, path in list_checkpoints(output_dir)
            if run_id is not None and checkpoint_problem(path, run_id) is None]


def run_contents(output_dir: str) -> list[str]:
    """The entries of ``output_dir`` that show a training run wrote there (checkpoints, weights, state).

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); os.mkdir(os.path.join(d, "checkpoint-3")); open(os.path.join(d, "notes.txt"), "w").close()
    >>> run_contents(d)
    ['checkpoint-3']
    """
    try:
        names = sorted(os.listdir(output_dir))
    except OSError:
        return []
    return [n for n in names if n in _RUN_MARKS or CHECKPOINT_NAME.match(n)]
