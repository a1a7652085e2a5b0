"""Thin integration with TRL's ``SFTTrainer`` and transformers' ``Trainer``.

The collator works with the stock trainers as it is (``SFTTrainer(..., data_collator=collator)``). This module adds
what the stock trainers cannot know about it:

- :func:`check_trainer_args`: fails early, naming the fix, on settings that conflict with a collator that flattens
  by itself (TRL's own ``padding_free`` / BFD packing would reject any custom collator with a vaguer message);
- :class:`PackingCheckCallback`: runs :func:`trl_padfree.probe.assert_packing_safe` once before training, so a
  model whose attention lets packed examples see each other stops the run instead of silently training worse;
- :class:`SFTTrainer`: ``trl.SFTTrainer`` with both wired in whenever its collator is this package's padding-free
  collator. A drop-in replacement: ``from trl_padfree import SFTTrainer``.
"""

from __future__ import annotations

import inspect
from typing import Any

import trl
from transformers import TrainerCallback

from .collator import DataCollatorForCompletionOnlyLM


def is_padding_free_collator(collator: Any) -> bool:
    return isinstance(collator, DataCollatorForCompletionOnlyLM) and collator.padding_free


def check_trainer_args(args: Any, collator: Any) -> None:
    """Raise a ``ValueError`` naming the fix when trainer arguments conflict with a flattening collator."""
    if not is_padding_free_collator(collator) or args is None:
        return
    if getattr(args, "padding_free", False):
        raise ValueError(
            "SFTConfig(padding_free=True) conflicts with DataCollatorForCompletionOnlyLM(padding_free=True): TRL "
            "rejects any custom collator in its own padding-free mode. Set padding_free=False in SFTConfig; the "
            "collator flattens the batch itself."
        )
    if getattr(args, "packing", False) and getattr(args, "packing_strategy", None) in {"bfd", "bfd_split"}:
        raise ValueError(
            f"SFTConfig(packing=True, packing_strategy={args.packing_strategy!r}) turns on TRL's own padding-free "
            "mode, which rejects any custom collator. Set packing=False: the collator keeps the same examples in "
            "the same mini-batches and flattens each batch itself (the paper's setting)."
        )


class PackingCheckCallback(TrainerCallback):
    """Runs the packing probe on the model once, when training begins; raises if packed examples leak."""

    def __init__(self, **probe_kwargs: Any):
        self.probe_kwargs = probe_kwargs
        self.report = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None and self.report is None:
            from .probe import assert_packing_safe, training_rtol

            kwargs = {"rtol": training_rtol(args), **self.probe_kwargs}
            self.report = assert_packing_safe(model, **kwargs)
            if state.is_world_process_zero:  # one line, so that a run's log shows the probe ran and passed
                print(probe_passed_line(self.report), flush=True)
        return control


def probe_passed_line(report: Any) -> str:
    """The one log line of a passed packing probe (the launcher prints the same line)."""
    return (f"[trl-padfree] packing probe: {report.model_type} with {report.attn_implementation!r} keeps packed "
            f"examples apart (max logit diff {report.max_abs_diff:.2g} <= tolerance {report.tolerance:.2g})")


class SFTTrainer(trl.SFTTrainer):
    """``trl.SFTTrainer`` that validates its settings for this collator and probes the model before training.

    Everything else is TRL's. Pass ``check_packing=False`` to skip the probe (e.g. for a model the probe cannot
    run, such as one that needs extra inputs).
    """

    def __init__(self, *args: Any, check_packing: bool = True, **kwargs: Any):
        bound = inspect.signature(trl.SFTTrainer.__init__).bind_partial(None, *args, **kwargs).arguments
        collator = bound.get("data_collator")
        check_trainer_args(bound.get("args"), collator)
        super().__init__(*args, **kwargs)
        if check_packing and is_padding_free_collator(collator):
            self.add_callback(PackingCheckCallback())

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; a run that fails (e.g. the packing probe stops it) closes its progress bar.

        Otherwise the bar, opened before the probe raised, is printed when the interpreter exits (a stray
        ``0%| | 0/N`` after everything else).
        """
        try:
            return super().train(*args, **kwargs)
        except BaseException:
            from transformers.trainer_callback import ProgressCallback

            for callback in self.callback_handler.callbacks:
                if isinstance(callback, ProgressCallback) and callback.training_bar is not None:
                    callback.training_bar.close()
                    callback.training_bar = None
            raise

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save as ``Trainer`` does, with ``use_cache: true`` in the saved ``config.json``.

        Training runs without a KV cache (the Trainer sets ``model.config.use_cache = args.use_cache``, False);
        whoever loads the saved model for generation expects the cache on. The model in memory keeps False.
        """
        config = getattr(self.accelerator.unwrap_model(self.model), "config", None)
        if config is None or getattr(config, "use_cache", None) is not False:
            return super().save_model(output_dir, _internal_call)
        config.use_cache = True
        try:
            super().save_model(output_dir, _internal_call)
        finally:
            config.use_cache = False
