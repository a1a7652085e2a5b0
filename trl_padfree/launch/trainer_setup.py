"""How the launch builds every trainer: :func:`make_launch_trainer` and :class:`LaunchTrainer`, the mixins
each task's module-level trainer class puts before the package's trainer (e.g. ``tasks/dpo.py``'s
``LaunchDPOTrainer``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .atomic_save import AtomicCheckpoints
from .whole_run import WholeRunLog

__all__ = ["LaunchTrainer", "make_launch_trainer"]


class LaunchTrainer(AtomicCheckpoints, WholeRunLog):
    """Mixins of a launch trainer: checkpoints that appear complete or not at all (:mod:`.atomic_save`), (real tokens/s
    and GRPO/RLOO's generation time come with the package's trainers, :mod:`trl_padfree.throughput`) and the log the summary of the whole
    run needs (:mod:`.whole_run`). Put first: ``class LaunchXTrainer(LaunchTrainer,
    XTrainer)``."""


def make_launch_trainer(trainer_class: type, cfg: Any, tokenizer: Any, model: Any, data: Any,
                        callbacks: Sequence[Any], **own: Any) -> Any:
    """``trainer_class`` built with what every launch trainer takes from the run: the model, TRL's config, the
    prepared ``data.train`` / ``data.eval``, the tokenizer, ``ModelConfig``'s PEFT settings and the callbacks; no
    packing check (the launch probed the model before anything was written) and no thread policy of its own (the
    launch picks threads, :mod:`.defaults`). ``own``: the trainer's own arguments."""
    from trl import get_peft_config

    return trainer_class(
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
