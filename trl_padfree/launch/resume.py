"""Which checkpoint a run resumes: the newest one of the run (:data:`RUN_FILE`) with a completion marker
(:data:`CHECKPOINT_MARKER`, written by :class:`~.callbacks.CheckpointMarker`); ``auto`` and torchrun's restarts: the
same, or a new run where there is none."""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import Any, NamedTuple

from .config import ConfigError

RUN_FILE = "trl_padfree_run.json"
CHECKPOINT_MARKER = "trl_padfree_checkpoint.json"
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
_WEIGHTS = ("model.safetensors", "adapter_model.safetensors", "pytorch_model.bin", "adapter_model.bin",
            "model.safetensors.index.json", "pytorch_model.bin.index.json")


def read_json(path: str) -> dict[str, Any] | None:
    """The JSON mapping in ``path``, or None if it is missing, unreadable or not a mapping."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` whole or not at all (a synced temporary file, renamed).

    >>> import tempfile; d = tempfile.mkdtemp(); write_json(f"{d}/x.json", {"a": 1}); read_json(f"{d}/x.json")
    {'a': 1}
    """
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, default=str)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_run(output_dir: str, **fields: Any) -> None:
    path = os.path.join(output_dir, RUN_FILE)
    write_json(path, {**(read_json(path) or {}), **fields})


def list_checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """``(step, path)`` of every ``checkpoint-N`` directory in ``output_dir``, by step."""
    names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    found = [(int(m.group(1)), os.path.join(output_dir, n)) for n in names if (m := CHECKPOINT_NAME.match(n))]
    return sorted((step, path) for step, path in found if os.path.isdir(path))


def checkpoint_problem(path: str, run_id: str | None = None) -> str | None:
    """Why ``path`` is not a complete checkpoint (of run ``run_id``), or None: every file its marker lists at that
    size; without a marker (another tool's, no ``run_id`` asked) a readable ``trainer_state.json`` and weights."""
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
    weights = [n for n in os.listdir(path) if n in _WEIGHTS or n.startswith("pytorch_model_fsdp")]
    if not weights or not all(os.path.getsize(os.path.join(path, n)) for n in weights):
        return "it holds no model weights (model.safetensors, adapter_model.safetensors, ...) or they are empty"
    return None


def last_complete_checkpoint(output_dir: str, run_id: str | None) -> str | None:
    return next((path for _, path in reversed(list_checkpoints(output_dir))
                 if run_id is not None and checkpoint_problem(path, run_id) is None), None)


class ResumeChoice(NamedTuple):
    path: str
    step: int
    run_id: str
    skipped: list[str]  # the newer checkpoints passed over, each with why


def choose_resume(output_dir: str) -> ResumeChoice:
    """What ``resume_from_checkpoint: true`` means for ``output_dir``, or a :class:`ConfigError` why there is none."""
    run, checkpoints = read_json(os.path.join(output_dir, RUN_FILE)) or {}, list_checkpoints(output_dir)
    head = f"resume_from_checkpoint: true, but {output_dir!r}"
    if not run.get("run_id"):
        what = (f"its checkpoints ({', '.join(os.path.basename(p) for _, p in checkpoints)}) were not written by "
                "trl-padfree train" if checkpoints else "it holds no checkpoint-N directory")
        raise ConfigError(f"{head} holds no trl-padfree run to resume ({what}); pass a checkpoint directory "
                          "(resume_from_checkpoint: PATH) or start without resume_from_checkpoint")
    if run.get("status") == "finished":
        raise ConfigError(
            f"resume_from_checkpoint: true, but the run in {output_dir!r} is finished (step {run.get('global_step')} "
            f"of {run.get('max_steps')}; the model is saved there): nothing to resume; to train further, start a new run "
            f"from its model (model_name_or_path: {output_dir}) in another output_dir (a checkpoint resumed by path "
            "keeps its finished learning-rate schedule)")
    skipped = []
    for step, path in reversed(checkpoints):
        if (problem := checkpoint_problem(path, run["run_id"])) is None:
            return ResumeChoice(path, step, run["run_id"], skipped)
        skipped.append(f"{os.path.basename(path)} ({problem})")
    detail = f" ({'; '.join(skipped)})" if skipped else ""
    raise ConfigError(f"{head} holds no complete checkpoint of its run{detail}; start again without "
                      "resume_from_checkpoint (with overwrite_output_dir: true) or pass a checkpoint path")


def resolve_resume(cfg: Any, restart: int = 0) -> tuple[str | None, str, str | None]:
    """``(the checkpoint to resume or None, the run id, a note for the run)`` for ``resume_from_checkpoint`` false,
    true, a checkpoint path or ``auto``, which a torchrun restart (``restart`` > 0) also means: what ``true`` takes,
    else a new run."""
    value, output_dir = cfg.training.resume_from_checkpoint, cfg.training.output_dir
    word, run = str(value).lower(), read_json(os.path.join(output_dir, RUN_FILE))
    auto = word == "auto" or (value is None and restart > 0)
    why = ("resume_from_checkpoint: auto" if value is not None else f"torchrun restart {restart}") + ": " if auto else ""
    if word in {"true", "last", "latest"} or auto and (run or {}).get("run_id"):
        try:
            choice = choose_resume(output_dir)
            note = f"resuming from {choice.path} (step {choice.step}, the newest complete checkpoint of this run)"
            note += "; passed over: " + "; ".join(choice.skipped) if choice.skipped else ""
            return choice.path, choice.run_id, why + note
        except ConfigError:
            if not auto or run.get("status") == "finished":
                raise
    if auto or word in {"false", "none", "null", ""}:
        names = sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else []  # (those a run writes)
        found = [n for n in names if n in (RUN_FILE, "trainer_state.json", "launch_summary.json", *_WEIGHTS)
                 or CHECKPOINT_NAME.match(n)]
        if found and not (auto and run) and not getattr(cfg.launch, "overwrite_output_dir", False):
            shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
            raise ConfigError(
                f"{why}output_dir {output_dir!r} already holds {'files of another tool' if auto else 'a run'} ({shown})"
                f"; {'pass a checkpoint path' if auto else 'continue it with resume_from_checkpoint: true'}, start "
                "over in it with overwrite_output_dir: true, or choose another output_dir")
        note = f"{why}no complete checkpoint of an unfinished run in {output_dir}: starting a new run"
        return None, uuid.uuid4().hex, note if auto else None
    if not os.path.isdir(value):
        raise ConfigError(f"checkpoint not found: resume_from_checkpoint={value!r} is not a directory")
    problem = checkpoint_problem(value)
    if problem is not None:
        raise ConfigError(f"resume_from_checkpoint={value!r} is not a complete checkpoint: {problem}; pass a "
                          "checkpoint-N directory (or true for the newest complete one of the run in output_dir)")
    marker = read_json(os.path.join(value, CHECKPOINT_MARKER)) or {}
    return str(value), marker.get("run_id") or uuid.uuid4().hex, f"resuming from {value}"
