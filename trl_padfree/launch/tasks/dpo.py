"""``trl-padfree dpo``: preference training with :class:`trl_padfree.DPOTrainer` (TRL's, padding-free).

Its own parts (the functions live in :mod:`..dpo`, :mod:`..dpo_data` and :mod:`..validate`):
:class:`~..config.PreferenceArguments` (``prompt_once``, ``chat_template_path``) and TRL's ``DPOConfig``; SFT-only
fields refused; checked preference records; the reference model; the preference probe; the summary's eval reward
accuracy and ``prompt_once``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..config import ConfigError, DataArguments, HeadLaunchArguments, PreferenceArguments
from ..console import say
from .base import Task
from .shared import sft_only_fields

__all__ = ["TASK", "DPOTask"]

SFT_ONLY_MESSAGE = ("{name} is a setting of trl-padfree train (SFT); trl-padfree dpo trains on prompt/chosen/rejected "
                    "records and scores only the responses: remove it")


class DPOTask(Task):
    name = "dpo"
    command = "dpo"
    trainer_name = "DPOTrainer"

    def argument_classes(self) -> tuple[type, ...]:
        from trl import DPOConfig, ModelConfig

        return (DataArguments, PreferenceArguments, HeadLaunchArguments, DPOConfig, ModelConfig)

    def configure_parser(self, parser: Any) -> None:
        parser.help_groups = {
            "collator": "preference batch (trl_padfree.DPOTrainer: padding-free rows, prompt_once)",
            "training": "training (TRL DPOConfig / transformers TrainingArguments)",
        }
        parser.help_texts = {
            "padding_free": "Put the 2B sequences of each batch of B pairs in one row without padding "
            "(trl_padfree.DPOTrainer; TRL 1.16 itself pads). (default: true)",
        }
        parser.description = (
            "Preference-train a causal LM with trl_padfree.DPOTrainer (TRL's DPOTrainer, padding-free). --config "
            "FILE: a YAML mapping of any of the fields below (plus an optional `env` mapping of environment "
            "variables); command-line values override the file. Exit code 2 on bad input."
        )

    def foreign_field(self, name: str) -> Exception | None:
        return ConfigError(SFT_ONLY_MESSAGE.format(name=name)) if name in sft_only_fields(self) else None

    def check(self, cfg: Any) -> None:
        from ..validate import check_preference_config

        check_preference_config(cfg)

    def describe(self, cfg: Any) -> dict[str, Any]:
        return {"prompt_once": bool(cfg.collator.prompt_once)}

    def prepare_data(self, cfg: Any, tokenizer: Any) -> Any:
        """Checked preference records (TRL's DPOTrainer tokenizes them when built)."""
        from ..dpo import load_preference_data

        data = load_preference_data(cfg, tokenizer)
        say(f"data: {len(data.train)} training pairs" + (f", {len(data.eval)} eval pairs" if data.eval is not None
                                                          else "") + f" (format: {data.text_format})")
        for split, count in data.dropped.items():
            if count:
                total = len(data.train if split == "train" else data.eval)
                say(f"dropped {count} of {total} {split} pairs whose prompt alone has max_length="
                    f"{cfg.training.max_length} tokens or more (truncation_mode keep_start leaves them no response "
                    "token; TRL drops them)")
        return data

    def probe_check(self, cfg: Any) -> Any:
        from ..dpo import probe_check

        return probe_check(cfg)

    def load_reference(self, cfg: Any) -> tuple[Any, str | None]:
        from ..dpo import load_reference

        ref_model = load_reference(cfg)
        return ref_model, "reference model: " + ("a second copy of the starting weights" if ref_model is not None
                                                 else "the policy with its LoRA adapters switched off")

    def make_trainer(self, cfg: Any, tokenizer: Any, model: Any, ref_model: Any, data: Any,
                     callbacks: Sequence[Any]) -> Any:
        from ..dpo import make_trainer

        return make_trainer(cfg, tokenizer, model, ref_model, data, callbacks, **self.trainer_kwargs(cfg))

    def summary_settings(self, cfg: Any) -> dict[str, Any]:
        return {"prompt_once": bool(cfg.collator.prompt_once)}

    def summary_lines(self, lines: list[str], history: list[dict[str, Any]]) -> list[str]:
        from ..dpo import preference_summary

        return preference_summary(lines, history)

    def preview(self, cfg: Any, tokenizer: Any, n: int, color: bool) -> list[str]:
        from ..dpo import load_preference_data
        from ..preview import preview_pairs

        return list(preview_pairs(cfg, tokenizer, load_preference_data(cfg, tokenizer), n, color))


TASK = DPOTask()
