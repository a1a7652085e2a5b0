"""The launch's trainer classes: one of this package's trainers with the launch's atomic checkpoints and whole-run
log, made on first use (so that parsing a config imports no trainer) and once per trainer."""

from __future__ import annotations

import functools

__all__ = ["launch_trainer_class"]


@functools.cache
def launch_trainer_class(base: type, *mixins: type) -> type:
    """``base`` (one of this package's trainers) with the launch's atomic checkpoints and whole-run log, and
    ``mixins`` first (made on first use, so that parsing a config does not import the trainers)."""
    from .atomic_save import AtomicCheckpoints
    from .whole_run import WholeRunLog

    return type(f"Launch{base.__name__}", (*mixins, AtomicCheckpoints, WholeRunLog, base), {
        "__doc__": f"``{base.__name__}`` whose checkpoints appear complete or not at all (launch.atomic_save), "
                   "logging what the summary of the whole run needs (launch.whole_run).",
        "__module__": __name__,
    })
