"""The launch's trainer classes: one of this package's trainers with the launch's atomic checkpoints and whole-run
log, made on first use (so that parsing a config imports no trainer) and once per trainer."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

__all__ = ["launch_trainer_class", "make_launch_trainer"]


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


def make_launch_trainer(base: type, cfg: Any, tokenizer: Any, model: Any, data: Any, callbacks: Sequence[Any],
                        *mixins: type, **own: Any) -> Any:
    """:func:`launch_trainer_class` built with what every launch trainer takes from the run: the model, TRL's config,
    the prepared ``data.train`` / ``data.eval``, the tokenizer, ``ModelConfig``'s PEFT settings and the callbacks;
    no packing check (the launch probed the model before anything was written) and no thread policy of its own
    (the launch picks threads, :mod:`.defaults`). ``own``: the trainer's own arguments."""
    from trl import get_peft_config

    return launch_trainer_class(base, *mixins)(
        model=model,
        args=cfg.training,
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=tokenizer,
        peft_config=get_peft_config(cfg.model),
        callbacks=list(callbacks),
        check_packing=False,
        torch_num_threads=None,
        **own,
    )
