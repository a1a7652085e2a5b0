"""trl-padfree: padding-free, completion-only fine-tuning for TRL's SFTTrainer."""

from .collator import CollatorStats, DataCollatorForCompletionOnlyLM, TemplateNotFoundError
from .trainer import PackingCheckCallback, SFTTrainer, check_trainer_args

__version__ = "0.1.0"

__all__ = [
    "CollatorStats",
    "DataCollatorForCompletionOnlyLM",
    "PackingCheckCallback",
    "SFTTrainer",
    "TemplateNotFoundError",
    "__version__",
    "check_trainer_args",
]
