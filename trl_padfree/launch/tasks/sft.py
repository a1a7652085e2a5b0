"""``trl-padfree train``: SFT with :class:`trl_padfree.launch.trainer.PadfreeSFTTrainer` and this package's
completion-only collator (padding-free unless ``padding_free: false``).

Its own parts: :class:`~..config.CollatorArguments` (``response_template``, ``instruction_template``) and TRL's
``SFTConfig``; the SFTConfig fields it cannot honour (:func:`~..validate.check_sft_config`); the data tokenized and
labelled once by :mod:`..sft_data`, with the one response-template check, and a training collator that only
flattens those labels; the summary's ``max_tokens_per_batch``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ..config import CollatorArguments, DataArguments, HeadLaunchArguments
from ..console import say
from .base import Task

__all__ = ["TASK", "SFTTask", "launch_sft_trainer"]


@functools.cache
def launch_sft_trainer() -> type:
    """``PadfreeSFTTrainer`` whose checkpoints appear complete or not at all (:mod:`..atomic_save`); made on first
    use: parsing a config imports no trainer (help and refusals stay fast)."""
    from ..atomic_save import AtomicCheckpoints
    from ..trainer import PadfreeSFTTrainer

    return type("LaunchSFTTrainer", (AtomicCheckpoints, PadfreeSFTTrainer), {"__module__": __name__,
                                                                           "__doc__": launch_sft_trainer.__doc__})


class SFTTask(Task):
    name = "sft"
    command = "train"
    trainer_name = "SFTTrainer"

    def argument_classes(self) -> tuple[type, ...]:
        from trl import ModelConfig, SFTConfig

        return (DataArguments, CollatorArguments, HeadLaunchArguments, SFTConfig, ModelConfig)

    def check(self, cfg: Any) -> None:
        from ..validate import check_sft_config

        check_sft_config(cfg)

    def resolve(self, cfg: Any) -> None:
        training = cfg.training
        training.padding_free = False  # the collator flattens by itself; TRL refuses a custom collator otherwise
        training.dataset_kwargs = {**(training.dataset_kwargs or {}), "skip_prepare_dataset": True}

    def prepare_data(self, cfg: Any, tokenizer: Any) -> Any:
        """Formatted, tokenized and labelled once by the run's collator, with the template check."""
        from ..sft_data import prepare_data

        training = cfg.training
        data = prepare_data(cfg, tokenizer)
        say(f"data: {len(data.train)} training examples"
            + (f", {len(data.eval)} eval examples" if data.eval is not None else "") + f" (format: {data.text_format})")
        if data.template_missing_in_check:
            say(f"warning: {data.template_missing_in_check} of the first {data.checked} examples have no response "
                f"template {cfg.collator.response_template!r}")
        for split, count in data.dropped.items():
            if count:
                say(f"dropped {count} of {data.loaded[split]} {split} examples with no trained token left (response "
                    f"template missing, or the completion cut off by max_length={training.max_length})")
        return data

    def make_trainer(self, cfg: Any, tokenizer: Any, model: Any, ref_model: Any, data: Any,
                     callbacks: Sequence[Any]) -> Any:
        from trl import get_peft_config

        from ..sft_data import training_collator

        collator = training_collator(cfg, tokenizer)  # the labels are the data's: it flattens (or pads) them
        return launch_sft_trainer()(
            model=model,
            args=cfg.training,
            data_collator=collator,
            train_dataset=data.train,
            eval_dataset=data.eval,
            processing_class=tokenizer,
            peft_config=get_peft_config(cfg.model),
            callbacks=list(callbacks),  # extra callbacks act first within a step (a test hook signals before the check)
            max_tokens_per_batch=cfg.launch.max_tokens_per_batch,
            **self.trainer_kwargs(cfg),
        )

    def summary_settings(self, cfg: Any) -> dict[str, Any]:
        return {"max_tokens_per_batch": cfg.launch.max_tokens_per_batch}

    def preview(self, cfg: Any, tokenizer: Any, n: int, color: bool) -> list[str]:
        from ..preview import preview_lines
        from ..sft_data import prepare_data

        data = prepare_data(cfg, tokenizer)
        return list(preview_lines(data, tokenizer, n, color, cfg.collator.response_template))


TASK = SFTTask()
