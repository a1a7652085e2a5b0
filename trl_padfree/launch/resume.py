"""Which checkpoint a run resumes: ``resume_from_checkpoint: true`` (:func:`choose_resume`) takes the newest
checkpoint that carries this run's id and whose files match its marker (:func:`~.run_files.checkpoint_problem`),
and lists the ones it passed over (incomplete, another run's); ``auto`` and torchrun's restarts
(:func:`resolve_auto_resume`) take the same one, or start a new run where there is none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .config import ConfigError
from .run_files import CHECKPOINT_NAME, STAGING_DIR, checkpoint_problem, list_checkpoints, run_contents
from .run_record import new_run_id, read_run

__all__ = ["ResumeChoice", "choose_resume", "resolve_auto_resume"]


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
    partial = sorted(n for n in os.listdir(staging) if CHECKPOINT_NAME.match(n)) if os.path.isdir(staging) else []
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


def resolve_auto_resume(cfg: Any, restart: int) -> dict[str, Any] | None:
    """``resume_from_checkpoint: auto``, and torchrun's restarts: the checkpoint, run id and notes to resolve ``cfg``
    with (the fields to change and their values; ``cfg`` is not changed).

    ``auto`` (or no ``resume_from_checkpoint`` at all in a worker that torchrun restarted, ``restart`` > 0): the
    newest complete checkpoint of the unfinished run in ``output_dir``, as ``true`` would take it; where that run
    has no complete checkpoint yet, or ``output_dir`` holds no run, a new run starts (what a restart after a
    failure before the first checkpoint needs). A finished run is refused as with ``true``; checkpoints of another
    tool are refused as without ``resume_from_checkpoint`` (unless ``overwrite_output_dir``). Returns None when
    ``resume_from_checkpoint`` asks for something else (the caller handles it).
    """
    value = cfg.resume_from_checkpoint
    if not (str(value).lower() == "auto" or (value is None and restart > 0)):
        return None
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
        return {"resume_from_checkpoint": choice.path, "run_id": choice.run_id,
                "notes": [*cfg.notes, f"{why}: {choice.note()}"]}
    found = run_contents(output_dir)
    if found and run is None and not getattr(cfg.launch, "overwrite_output_dir", False):
        raise ConfigError(
            f"{why}, but output_dir {output_dir!r} holds files of another tool ({', '.join(found[:4])}) and no "
            "trl-padfree run; pass a checkpoint path, start over with overwrite_output_dir: true, or choose another "
            "output_dir"
        )
    return {"resume_from_checkpoint": None, "run_id": new_run_id(),
            "notes": [*cfg.notes, f"{why}: no complete checkpoint of an unfinished run in {output_dir}: starting a "
                      "new run"]}
