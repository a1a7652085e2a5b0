"""Checkpoints and final saves of ``trl-padfree train`` that are complete or absent, never half-written.

What a run leaves in ``output_dir``:

- ``trl_padfree_run.json`` (:data:`RUN_FILE`): the run's id and status (``training``, ``interrupted``,
  ``finished``, ``failed``), written atomically at the start and at the end of the run;
- ``checkpoint-N/``: written first under ``.trl_padfree_partial/checkpoint-N`` (:data:`STAGING_DIR`), then
  completed with ``trl_padfree_checkpoint.json`` (:data:`CHECKPOINT_MARKER`: the run id, the step and the size of
  every file), synced to disk and renamed into place. A run killed while saving leaves its partial files in the
  staging directory only; ``checkpoint-N`` appears complete or not at all.
- the final model: saved the same way (staging directory, then each file moved into ``output_dir``), so a save
  that fails (disk full) leaves no truncated weights behind.

``resume_from_checkpoint: true`` (:func:`choose_resume`) takes the newest checkpoint that carries this run's id
and whose files match its marker, and lists the ones it passed over (incomplete, another run's).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..messages import one_line
from .config import ConfigError

__all__ = [
    "CHECKPOINT_MARKER",
    "RUN_FILE",
    "STAGING_DIR",
    "AtomicCheckpoints",
    "ResumeChoice",
    "RunError",
    "any_process",
    "begin_run",
    "checkpoint_problem",
    "choose_resume",
    "complete_steps",
    "crash_reported",
    "end_run",
    "first_failure",
    "last_complete_checkpoint",
    "list_checkpoints",
    "mark_complete",
    "new_run_id",
    "read_json",
    "read_run",
    "resolve_auto_resume",
    "run_contents",
    "save_final_model",
    "trainer_settings_checked",
    "write_json_atomic",
    "write_run",
]

RUN_FILE = "trl_padfree_run.json"
CHECKPOINT_MARKER = "trl_padfree_checkpoint.json"
STAGING_DIR = ".trl_padfree_partial"

_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
#: Files that hold a checkpoint's model weights (any one of them, or a sharded index).
_WEIGHTS = ("model.safetensors", "adapter_model.safetensors", "pytorch_model.bin", "adapter_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
#: What in an output_dir shows that a training run wrote there.
_RUN_MARKS = (RUN_FILE, "trainer_state.json", "launch_summary.json", *_WEIGHTS, *_INDEXES)


class RunError(RuntimeError):
    """A failure during the run itself (not bad input): ``main`` prints the one-line message and exits with 1."""


def new_run_id() -> str:
    """A fresh run id (32 hex digits).

    >>> len(new_run_id()), new_run_id() != new_run_id()
    (32, True)
    """
    return uuid.uuid4().hex


# ------------------------------------------------------------------------------------------ files


def _fsync_path(path: str) -> None:
    """Flush a file or directory to disk (best effort where the filesystem does not support it)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) and hasattr(os, "O_DIRECTORY") else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path``: a temporary file in the same directory, synced, then renamed.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> write_json_atomic(os.path.join(d, "x.json"), {"a": 1}); read_json(os.path.join(d, "x.json"))
    {'a': 1}
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the run's other files are not
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, default=str)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_path(directory)


def read_json(path: str) -> dict[str, Any] | None:
    """The JSON mapping in ``path``, or None if it is missing, unreadable or not a mapping."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_run(output_dir: str) -> dict[str, Any] | None:
    """The run record of ``output_dir`` (see the module docstring), or None."""
    return read_json(os.path.join(output_dir, RUN_FILE))


def write_run(output_dir: str, **fields: Any) -> None:
    """Update the run record of ``output_dir`` with ``fields`` (atomically)."""
    record = read_run(output_dir) or {}
    record.update(fields)
    write_json_atomic(os.path.join(output_dir, RUN_FILE), record)


def _file_sizes(directory: str) -> dict[str, int]:
    sizes = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory)
            if rel != CHECKPOINT_MARKER:
                sizes[rel] = os.path.getsize(path)
    return sizes


def _sync_files(directory: str) -> dict[str, int]:
    """Flush every file under ``directory`` to disk; their sizes, as :func:`_file_sizes` gives them."""
    sizes = _file_sizes(directory)
    for rel in sizes:
        _fsync_path(os.path.join(directory, rel))
    return sizes


# ------------------------------------------------------------------------------------------ inspecting


def list_checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """``(step, path)`` of every ``checkpoint-N`` directory in ``output_dir``, by step."""
    try:
        names = os.listdir(output_dir)
    except OSError:
        return []
    found = []
    for name in names:
        match = _CHECKPOINT_RE.match(name)
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


@dataclass
class ResumeChoice:
    """The checkpoint ``resume_from_checkpoint: true`` resolved to, and the ones it passed over (with why)."""

    path: str
    step: int
    run_id: str | None
    skipped: list[str] = field(default_factory=list)

    def note(self) -> str:
        """The line the launcher prints about this choice."""
        text = f"resuming from {self.path} (step {self.step}, the newest complete checkpoint of this run)"
        if self.skipped:
            text += "; passed over: " + "; ".join(self.skipped)
        return text


def choose_resume(output_dir: str) -> ResumeChoice:
    """What ``resume_from_checkpoint: true`` means for ``output_dir``; :class:`ConfigError` if nothing fits.

    Refused: no run of this launcher in ``output_dir``; a finished run (nothing left to train: the final model is
    there); no complete checkpoint of this run.
    """
    run = read_run(output_dir) if os.path.isdir(output_dir) else None
    checkpoints = list_checkpoints(output_dir)
    if run is None or not run.get("run_id"):
        what = (f"its checkpoints ({', '.join(os.path.basename(p) for _, p in checkpoints)}) were not written by "
                "trl-padfree train" if checkpoints else "it holds no checkpoint-N directory")
        raise ConfigError(
            f"resume_from_checkpoint: true, but {output_dir!r} holds no trl-padfree run to resume ({what}); pass a "
            "checkpoint directory (resume_from_checkpoint: PATH) or start without resume_from_checkpoint"
        )
    run_id = run["run_id"]
    if run.get("status") == "finished":
        raise ConfigError(
            f"resume_from_checkpoint: true, but the run in {output_dir!r} is finished (step "
            f"{run.get('global_step')} of {run.get('max_steps')}; the model is saved there): nothing to resume; to "
            "train further, resume one of its checkpoints by path with a larger max_steps, or start a new run from "
            "the model (model_name_or_path) in another output_dir"
        )
    staging = os.path.join(output_dir, STAGING_DIR)
    partial = sorted(n for n in os.listdir(staging) if _CHECKPOINT_RE.match(n)) if os.path.isdir(staging) else []
    skipped = [f"{name} (its save was interrupted; the partial files are discarded)" for name in partial]
    for step, path in reversed(checkpoints):
        problem = checkpoint_problem(path, run_id)
        if problem is None:
            return ResumeChoice(path=path, step=step, run_id=run_id, skipped=skipped)
        skipped.append(f"{os.path.basename(path)} ({problem})")
    detail = f" ({'; '.join(skipped)})" if skipped else ""
    raise ConfigError(
        f"resume_from_checkpoint: true, but {output_dir!r} holds no complete checkpoint of its run{detail}; start "
        "again without resume_from_checkpoint (with overwrite_output_dir: true) or pass a checkpoint path"
    )


def resolve_auto_resume(cfg: Any, restart: int) -> bool:
    """``resume_from_checkpoint: auto``, and torchrun's restarts: resolve the checkpoint and the run id (in place).

    ``auto`` (or no ``resume_from_checkpoint`` at all in a worker that torchrun restarted, ``restart`` > 0): the
    newest complete checkpoint of the unfinished run in ``output_dir``, as ``true`` would take it; where that run
    has no complete checkpoint yet, or ``output_dir`` holds no run, a new run starts (what a restart after a
    failure before the first checkpoint needs). A finished run is refused as with ``true``; checkpoints of another
    tool are refused as without ``resume_from_checkpoint`` (unless ``overwrite_output_dir``). Returns False when
    ``resume_from_checkpoint`` asks for something else (the caller handles it).
    """
    value = cfg.resume_from_checkpoint
    if not (str(value).lower() == "auto" or (value is None and restart > 0)):
        return False
    why = "resume_from_checkpoint: auto" if value is not None else f"torchrun restart {restart}"
    output_dir = cfg.training.output_dir
    run = read_run(output_dir) if os.path.isdir(output_dir) else None
    choice = None
    if run is not None and run.get("run_id"):
        try:
            choice = choose_resume(output_dir)
        except ConfigError:
            if run.get("status") == "finished":
                raise
    if choice is not None:
        cfg.resume_from_checkpoint, cfg.run_id = choice.path, choice.run_id
        cfg.notes.append(f"{why}: {choice.note()}")
        return True
    found = run_contents(output_dir)
    if found and run is None and not getattr(cfg.launch, "overwrite_output_dir", False):
        raise ConfigError(
            f"{why}, but output_dir {output_dir!r} holds files of another tool ({', '.join(found[:4])}) and no "
            "trl-padfree run; pass a checkpoint path, start over with overwrite_output_dir: true, or choose another "
            "output_dir"
        )
    cfg.resume_from_checkpoint, cfg.run_id = None, new_run_id()
    cfg.notes.append(f"{why}: no complete checkpoint of an unfinished run in {output_dir}: starting a new run")
    return True


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
    return [n for n in names if n in _RUN_MARKS or _CHECKPOINT_RE.match(n)]


# ------------------------------------------------------------------------------------------ saving


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is set on any process (an all-reduce when distributed), so that all take the same path."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    device = torch.device("cpu") if dist.get_backend() == "gloo" else torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def _move_into(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``, replacing a directory already at ``dst`` only once ``src`` is in place."""
    if os.path.isdir(dst) and not os.path.islink(dst):
        old = f"{src}.replaced"
        os.rename(dst, old)
        os.rename(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)


def _remove_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def first_failure(error: BaseException | None, collective: bool = True) -> str | None:
    """``": <reason>"`` of the first process whose part failed (``" on rank R (node N, local rank L): <reason>"``
    under several processes), or None when none did. With ``collective`` every process must call it: the reasons
    are gathered (a barrier), so that all take the same path and name the same process."""
    import torch.distributed as dist

    reason = None if error is None else one_line(error, limit=200)
    if not (dist.is_available() and dist.is_initialized()):
        return None if reason is None else f": {reason}"
    from .console import where

    rank = dist.get_rank()
    if not collective:
        return None if reason is None else f" on rank {rank} ({where()}): {reason}"
    from .rendezvous import gather_reports

    failures = gather_reports(reason)
    if not failures:
        return None
    rank, place, reason = failures[0]
    return f" on rank {rank} ({place}): {reason}"


def mark_complete(staging: str, run_id: str | None, step: int) -> None:
    """Write the completion marker into ``staging`` and sync every file to disk."""
    sizes = _sync_files(staging)
    write_json_atomic(os.path.join(staging, CHECKPOINT_MARKER), {"run_id": run_id, "step": step, "files": sizes})


class AtomicCheckpoints:
    """Trainer mixin: ``checkpoint-N`` is written under :data:`STAGING_DIR` and renamed into place when complete.

    Put it before the Trainer class (``class T(AtomicCheckpoints, SFTTrainer)``) and set ``run_id`` on the
    instance; every checkpoint's marker carries it.
    """

    run_id: str | None = None
    _staging_root: str | None = None

    def _get_output_dir(self, trial: Any) -> str:
        if self._staging_root is not None:
            return self._staging_root
        return super()._get_output_dir(trial)  # type: ignore[misc]

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        from transformers.trainer_utils import rotate_checkpoints

        run_dir = super()._get_output_dir(trial)  # type: ignore[misc]
        name = f"checkpoint-{self.state.global_step}"  # type: ignore[attr-defined]
        staging_root = os.path.join(run_dir, STAGING_DIR)
        staging = os.path.join(staging_root, name)
        main = self.args.should_save  # type: ignore[attr-defined]
        if main and os.path.exists(staging):
            shutil.rmtree(staging)  # the leftovers of a save that was interrupted
        self.accelerator.wait_for_everyone()  # type: ignore[attr-defined]
        self._staging_root = staging_root
        error: BaseException | None = None
        try:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]
        except Exception as exc:  # OSError, or the safetensors writer's own error type
            error = exc
        finally:
            self._staging_root = None
        failure = first_failure(error)  # also the barrier: every process wrote its files, or one failed
        if failure is not None:
            raise self._save_failed(failure, run_dir, staging) from error
        if not main:
            return
        final = os.path.join(run_dir, name)
        state = self.state  # type: ignore[attr-defined]
        try:
            if state.best_model_checkpoint and os.path.abspath(state.best_model_checkpoint) == os.path.abspath(staging):
                state.best_model_checkpoint = final
                state.save_to_json(os.path.join(staging, "trainer_state.json"))
            mark_complete(staging, self.run_id, state.global_step)
            _move_into(staging, final)
        except OSError as exc:
            raise self._save_failed(first_failure(exc, collective=False), run_dir, staging) from exc
        _remove_if_empty(staging_root)
        _fsync_path(run_dir)
        rotate_checkpoints(
            output_dir=run_dir,
            save_total_limit=self.args.save_total_limit,  # type: ignore[attr-defined]
            best_model_checkpoint=state.best_model_checkpoint,
            use_mtime=True,
        )


    def _save_failed(self, failure: str, run_dir: str, staging: str) -> RunError:
        """Remove the partial checkpoint; the one-line error naming the last complete checkpoint of this run."""
        if self.args.should_save:  # type: ignore[attr-defined]
            shutil.rmtree(staging, ignore_errors=True)
            _remove_if_empty(os.path.dirname(staging))
        last = last_complete_checkpoint(run_dir, self.run_id)
        return RunError(
            f"could not write {os.path.basename(staging)}{failure}; "
            + (f"the last complete checkpoint is {last}" if last else "no complete checkpoint of this run exists")
            + " (free space, then resume with --resume_from_checkpoint true)"
        )


def save_final_model(trainer: Any, output_dir: str) -> None:
    """``trainer.save_model(output_dir)``, through a staging directory: the files appear only once all are written.

    Raises :class:`RunError` (one line, naming the last complete checkpoint of the run) if the save fails, after
    removing what it had written.
    """
    staging_root = os.path.join(output_dir, STAGING_DIR)
    staging = os.path.join(staging_root, "final")
    main = trainer.args.should_save
    error: BaseException | None = None
    try:
        if main and os.path.exists(staging):
            shutil.rmtree(staging)
        trainer.save_model(staging)
        if main:
            _sync_files(staging)
    except Exception as exc:  # OSError, or the safetensors writer's own error type
        error = exc
    if any_process(error is not None):
        if main:
            shutil.rmtree(staging, ignore_errors=True)
            _remove_if_empty(staging_root)
        last = last_complete_checkpoint(output_dir, getattr(trainer, "run_id", None))
        where = (f"the last complete checkpoint is {last} (resume with --resume_from_checkpoint true once there is "
                 "space)" if last else "no checkpoint of this run was saved (save_strategy), so the trained "
                 "weights are lost")
        reason = one_line(error, limit=200) if error is not None else "it failed on another process"
        raise RunError(f"could not save the final model to {output_dir!r}: {reason}; {where}")
    if main:
        for name in sorted(os.listdir(staging)):
            _move_into(os.path.join(staging, name), os.path.join(output_dir, name))
        _remove_if_empty(staging)
        _remove_if_empty(staging_root)
        _fsync_path(output_dir)
    trainer.accelerator.wait_for_everyone()


# ------------------------------------------------------------------------------------------ the run's record


@contextlib.contextmanager
def trainer_settings_checked(output_dir: str, trainer: str = "SFTTrainer") -> Iterator[None]:
    """Around building the trainer: a ``ValueError`` (TRL's and transformers' own checks of settings against the
    model and data, e.g. ``router_aux_loss_coef`` for a model that is not a mixture of experts) becomes a
    :class:`ConfigError` (exit 2, one line naming ``trainer``), and the ``output_dir`` the Trainer created for
    nothing is removed.
    """
    existed = os.path.exists(output_dir)
    try:
        yield
    except ValueError as exc:
        if not existed:
            _remove_if_empty(output_dir)
        raise ConfigError(f"{trainer} refused the settings: {one_line(exc)}") from None


def begin_run(trainer: Any, run_id: str | None, resume_from: str | None) -> bool:
    """Record the run in ``output_dir`` (main process) and tell whether there is anything left to train.

    Returns False when ``resume_from`` is already at the run's last step (a run whose final save failed after
    its last checkpoint): the checkpoint's weights and state are then loaded here and the caller skips
    ``trainer.train()`` (the Trainer would train one step past the end).
    """
    from transformers import TrainerState

    trainer.run_id = run_id
    output_dir = trainer.args.output_dir
    if trainer.args.save_on_each_node and _several_nodes():
        # transformers 5.24's save_pretrained writes on global rank 0 only once torch.distributed is up
        # (PreTrainedModel.should_save_on_this_rank), whatever save_on_each_node says: every other node's
        # checkpoints and final model would lack their weights and config. The Trainer decides (args.should_save).
        model = trainer.accelerator.unwrap_model(trainer.model)
        model.should_save_on_this_rank = lambda is_main_process: bool(is_main_process)
    if trainer.args.should_save:
        os.makedirs(output_dir, exist_ok=True)
        shutil.rmtree(os.path.join(output_dir, STAGING_DIR), ignore_errors=True)  # saves that were interrupted
        write_run(output_dir, run_id=run_id, status="training", resumed_from=resume_from)
    if resume_from is None:
        return True
    state = read_json(os.path.join(resume_from, "trainer_state.json")) or {}
    max_steps = trainer.set_initial_training_values(trainer.args, trainer.get_train_dataloader())[-1]
    if int(state.get("global_step", 0)) < max_steps:
        return True
    trainer._load_from_checkpoint(resume_from)
    trainer.state = TrainerState.load_from_json(os.path.join(resume_from, "trainer_state.json"))
    return False


@contextlib.contextmanager
def crash_reported(trainer: Any, say: Callable[[str], None]) -> Iterator[None]:
    """Around training: when it stops with an error, say where the work is (the error itself propagates)."""
    try:
        yield
    except RunError:
        raise  # says it already
    except Exception:
        last = last_complete_checkpoint(trainer.args.output_dir, trainer.run_id)
        say(f"training stopped by an error at step {trainer.state.global_step}; "
            + (f"the last complete checkpoint of this run is {last} (resume with --resume_from_checkpoint true)"
               if last else "no checkpoint of this run was saved"))
        raise


def _several_nodes() -> bool:
    """Whether this run's processes span several nodes (torchrun's ``LOCAL_WORLD_SIZE`` < ``WORLD_SIZE``)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("LOCAL_WORLD_SIZE", str(world))) < world


def _share_summary(trainer: Any) -> None:
    """Several nodes: rank 0's summary reaches every node's console, and (each node saving to its own disk) its
    ``launch_summary.json`` and ``trainer_state.json`` too, with this node's paths. Every process calls it."""
    import dataclasses

    import torch.distributed as dist

    from .console import say
    from .summary import RunResult, summary_lines

    if not (_several_nodes() and dist.is_available() and dist.is_initialized()):
        return
    output_dir = trainer.args.output_dir
    box = [read_json(os.path.join(output_dir, "launch_summary.json")) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    summary = box[0]
    if dist.get_rank() == 0 or summary is None:
        return
    for key in ("saved_to", "checkpoint"):
        if summary.get(key):
            summary[key] = output_dir if key == "saved_to" else os.path.join(output_dir, os.path.basename(summary[key]))
    if trainer.args.should_save:
        write_json_atomic(os.path.join(output_dir, "launch_summary.json"), summary)
        trainer.state.save_to_json(os.path.join(output_dir, "trainer_state.json"))
    result = RunResult(**{f.name: summary.get(f.name) for f in dataclasses.fields(RunResult)})
    for line in summary_lines(result, bool(summary.get("padding_free", True))):
        say(line)


def end_run(trainer: Any, status: str, **fields: Any) -> None:
    """Record how the run ended (``finished``, ``interrupted``, ``failed``) in its run file (main process).

    Best effort for ``failed`` (the disk may be full): the failure itself is what gets reported. Other statuses
    are reached by every process together: on several nodes each one then gets rank 0's summary.
    """
    if status != "failed":
        _share_summary(trainer)
    if trainer.args.should_save:
        try:
            write_run(trainer.args.output_dir, status=status, global_step=trainer.state.global_step,
                      max_steps=trainer.state.max_steps, **fields)
        except OSError:
            if status != "failed":
                raise
